"""A readable summary of a running job, from JobService.GetJobStatus."""

from __future__ import annotations

from dlrover.master.v1 import job_pb2

__all__ = ["format_status"]


def format_status(status: job_pb2.GetJobStatusResponse) -> str:
    """Render a job status as a few lines of text and a table of ranks."""
    lines = [
        f"job {status.job_name}: {status.state}" + (f" ({status.exit_reason})" if status.exit_reason else ""),
        f"nodes: {sum(1 for n in status.nodes if n.state == 'running')} running of "
        f"{status.min_nodes}..{status.max_nodes}; failures {status.job_failures}; "
        f"relaunches {status.total_relaunches}",
        f"size: target {status.target_nodes} of {status.wanted_nodes} wanted; backend capacity "
        + (f"{status.capacity} free slot(s)" if status.HasField("capacity") else "unbounded"),
        f"step {status.step}; committed checkpoint "
        + (str(status.committed_step) if status.has_committed_step else "none")
        + f"; goodput {status.goodput:.1%} over {status.elapsed_s:.0f}s",
        "",
        f"{'rank':>4}  {'node':>5}  {'state':<11}  {'host':<20}  {'step':>8}  {'hb_age':>7}  {'relaunch':>8}  note",
    ]
    for n in sorted(status.nodes, key=lambda x: x.rank):
        note = n.last_failure or n.last_reason
        lines.append(
            f"{n.rank:>4}  {n.node_id:>5}  {n.state:<11}  {n.host[:20]:<20}  {n.step:>8}  "
            f"{n.seconds_since_heartbeat:>6.1f}s  {n.relaunch_count:>8}  {note[:80]}"
        )
    return "\n".join(lines)
