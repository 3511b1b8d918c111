"""A job's status as people and tools see it: `JobSummary`, built from the master's `JobStatus`.

The same summary is what `JobService.GetJobStatus` answers and what `MasterClient.job_status`
returns, so `format_status` renders it alike in-process and across the wire.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import attrs

from dlrover.master.records import NodeRecord
from dlrover.master.states import JobState, NodeState

if TYPE_CHECKING:  # the client renders summaries without loading the master
    from dlrover.master.master import JobStatus

__all__ = ["JobSummary", "NodeSummary", "format_status", "summarize"]


@attrs.frozen
class NodeSummary:
    """The current incarnation of one rank.

    Attributes:
        node_id: the incarnation's id.
        rank: the logical rank it serves.
        state: where it is in its life.
        name: its agent's self-given name (empty before it registered).
        host: the host it runs on (empty before it is known).
        relaunch_count: incarnations of the rank before this one.
        process_restarts: training-process restarts on this incarnation.
        step: the newest step it reported (-1 before any).
        seconds_since_heartbeat: how long ago its last sign of life came.
        last_failure: the kind and evidence of its last failure (empty if none).
        last_reason: why it entered its state.
    """

    node_id: int
    rank: int
    state: NodeState
    name: str = ""
    host: str = ""
    relaunch_count: int = 0
    process_restarts: int = 0
    step: int = -1
    seconds_since_heartbeat: float = 0.0
    last_failure: str = ""
    last_reason: str = ""


@attrs.frozen
class JobSummary:
    """The job's state and the current incarnation of every rank.

    Attributes:
        job_name: the job.
        state: the job's state.
        exit_reason: why it ended (empty while it runs).
        nodes: the current incarnation of every rank, by rank.
        min_nodes: fewest nodes it trains with.
        max_nodes: most nodes it runs.
        job_failures: failures so far.
        step: the newest step any current node reported (-1 before any).
        committed_step: the newest committed checkpoint step; None before any.
        goodput: useful training time over elapsed time so far (0..1).
        elapsed_s: seconds since the job started (wall clock).
        total_relaunches: nodes replaced so far.
        samples_per_second: the job's samples per second over the master's recent window.
        useful_s: seconds of steps that were kept.
        goodput_buckets: the rest of the elapsed time, `(bucket, seconds)` in the order of
            `dlrover.master.goodput.BUCKETS`.
        committed_path: where the newest committed checkpoint is ("" without one).
        committed_wall_time: when it was committed (wall seconds; 0 without one).
        target_nodes: how many nodes the job is sized to now.
        wanted_nodes: how many the last resize asked for.
        capacity: how many more nodes the backend could place now (negative: it holds more than
            it has room for); None when unknown or unbounded.
        spares: the warm spares that are pending, starting or running (rank -1: they hold none).
        spare_nodes: how many warm spares the job keeps (``--spare-nodes``).
    """

    job_name: str
    state: JobState
    exit_reason: str
    nodes: tuple[NodeSummary, ...]
    min_nodes: int
    max_nodes: int
    job_failures: int = 0
    step: int = -1
    committed_step: int | None = None
    goodput: float = 0.0
    elapsed_s: float = 0.0
    total_relaunches: int = 0
    samples_per_second: float = 0.0
    useful_s: float = 0.0
    goodput_buckets: tuple[tuple[str, float], ...] = ()
    committed_path: str = ""
    committed_wall_time: float = 0.0
    target_nodes: int = 0
    wanted_nodes: int = 0
    capacity: int | None = None
    spares: tuple[NodeSummary, ...] = ()
    spare_nodes: int = 0


def _node_summary(n: NodeRecord, now: float) -> NodeSummary:
    return NodeSummary(
        node_id=n.node_id,
        rank=n.rank,
        state=n.state,
        name=n.name,
        host=n.host,
        relaunch_count=n.relaunch_count,
        process_restarts=n.process_restarts,
        step=n.step,
        seconds_since_heartbeat=max(now - n.last_heartbeat, 0.0),
        last_failure=n.last_failure,
        last_reason=n.history[-1].reason if n.history else "",
    )


def summarize(status: JobStatus) -> JobSummary:
    """The summary of the master's `status` (ages of heartbeats taken at `status.now`)."""
    return JobSummary(
        job_name=status.job_name,
        state=status.state,
        exit_reason=status.exit_reason,
        nodes=tuple(
            NodeSummary(
                node_id=n.node_id,
                rank=n.rank,
                state=n.state,
                name=n.name,
                host=n.host,
                relaunch_count=n.relaunch_count,
                process_restarts=n.process_restarts,
                step=n.step,
                seconds_since_heartbeat=max(status.now - n.last_heartbeat, 0.0),
                last_failure=n.last_failure,
                last_reason=n.history[-1].reason if n.history else "",
            )
            for n in status.nodes
        ),
        min_nodes=status.min_nodes,
        max_nodes=status.max_nodes,
        job_failures=status.job_failures,
        step=status.step,
        committed_step=status.committed_step,
        goodput=status.goodput,
        elapsed_s=status.elapsed_s,
        total_relaunches=status.total_relaunches,
        samples_per_second=status.samples_per_second,
        useful_s=status.breakdown.useful_s,
        goodput_buckets=tuple(status.breakdown.buckets.items()),
        committed_path=status.committed_path,
        committed_wall_time=status.committed_wall_time,
        target_nodes=status.target_nodes,
        wanted_nodes=status.wanted_nodes,
        capacity=status.capacity,
        spares=tuple(_node_summary(n, status.now) for n in status.spares),
        spare_nodes=status.spare_nodes,
    )


def format_status(status: JobSummary) -> str:
    """Render a job summary as a few lines of text, the goodput breakdown and a table of ranks."""
    if status.committed_step is not None:
        when = time.strftime("%H:%M:%S", time.localtime(status.committed_wall_time))
        committed = f"{status.committed_step} at {status.committed_path or '(no path)'} ({when})"
    else:
        committed = "none"
    lines = [
        f"job {status.job_name}: {status.state.value}" + (f" ({status.exit_reason})" if status.exit_reason else ""),
        f"nodes: {sum(1 for n in status.nodes if n.state is NodeState.RUNNING)} running of "
        f"{status.min_nodes}..{status.max_nodes}; failures {status.job_failures}; "
        f"relaunches {status.total_relaunches}",
        f"size: target {status.target_nodes} of {status.wanted_nodes} wanted; backend capacity "
        + (f"{status.capacity} free slot(s)" if status.capacity is not None else "unbounded"),
        *_spare_lines(status),
        f"step {status.step}; {status.samples_per_second:.1f} samples/s; committed checkpoint {committed}",
        f"goodput {status.goodput:.1%} over {status.elapsed_s:.0f}s",
    ]
    if status.elapsed_s > 0:
        parts = [("useful", status.useful_s), *((name, sec) for name, sec in status.goodput_buckets)]
        lines.append(
            "  " + "; ".join(f"{name} {sec:.1f}s ({sec / status.elapsed_s:.1%})" for name, sec in parts if sec > 0)
        )
    lines += [
        "",
        f"{'rank':>4}  {'node':>5}  {'state':<11}  {'host':<20}  {'step':>8}  {'hb_age':>7}  {'relaunch':>8}  note",
    ]
    for n in sorted(status.nodes, key=lambda x: x.rank):
        note = n.last_failure or n.last_reason
        lines.append(
            f"{n.rank:>4}  {n.node_id:>5}  {n.state.value:<11}  {n.host[:20]:<20}  {n.step:>8}  "
            f"{n.seconds_since_heartbeat:>6.1f}s  {n.relaunch_count:>8}  {note[:80]}"
        )
    for n in sorted(status.spares, key=lambda x: x.node_id):
        note = n.last_failure or n.last_reason
        lines.append(
            f"{'spare':>4}  {n.node_id:>5}  {n.state.value:<11}  {n.host[:20]:<20}  {'-':>8}  "
            f"{n.seconds_since_heartbeat:>6.1f}s  {'-':>8}  {note[:80]}"
        )
    return "\n".join(lines)


def _spare_lines(status: JobSummary) -> list[str]:
    """The spares' line: only for a job that keeps spares or still has some."""
    if not status.spare_nodes and not status.spares:
        return []
    ready = sum(1 for n in status.spares if n.state is NodeState.RUNNING)
    return [
        f"spares: {ready} ready of {status.spare_nodes} kept ({len(status.spares) - ready} starting); "
        "they hold no rank and take over a relaunched node's"
    ]
