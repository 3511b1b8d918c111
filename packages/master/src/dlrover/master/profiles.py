"""Job profiles: what the master records at the end of a job, and the plan of a job that asks for nothing.

At job end the master records a `dlrover.autoscale.RunProfile` in the profile store (`ProfileRecorder`): the
resources and node counts the job ran with, samples per second at each node count (`ThroughputBySize`), each
node's peak host and accelerator memory, the parameter count and state size read from the last committed
checkpoint's manifest (`checkpoint_sizes`), and how it ended. Recording never fails the job.

A job submitted with neither `--nnodes` nor any `--node-*` flag is planned from the most similar earlier profile
(`plan_job`; similarity by `--job-kind`, the training script and the job name, see
`dlrover.autoscale.run_profiles`), else from the defaults: one node, nothing asked.

The store: `--profile-store PATH` (`MasterConfig.profile_store`), else `$DLROVER_PROFILE_STORE`, else
`$XDG_CACHE_HOME/dlrover/profiles.sqlite` (`~/.cache/dlrover/profiles.sqlite`); `none` disables it. A store that is
corrupt or from a newer schema version is set aside (renamed with a suffix) and a new one started.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from dlrover.autoscale import (
    JobSignature,
    Resources,
    RunPlanConfig,
    RunProfile,
    add_run,
    open_or_set_aside,
    plan_from_runs,
    read_runs,
)
from dlrover.common import ConfigError, DLRoverError
from dlrover.master.config import MasterConfig, NodeRange

__all__ = [
    "DEFAULT_PROFILE_STORE_NAME",
    "PROFILE_STORE_ENV_VAR",
    "JobPlanChoice",
    "ProfileRecorder",
    "ThroughputBySize",
    "add_profile_flags",
    "build_run_profile",
    "checkpoint_sizes",
    "default_profile_store",
    "defaults_instead",
    "plan_job",
    "read_profiles",
    "resolve_profile_store",
    "script_of",
    "signature_of",
]

_log = logging.getLogger(__name__)

PROFILE_STORE_ENV_VAR = "DLROVER_PROFILE_STORE"
DEFAULT_PROFILE_STORE_NAME = "profiles.sqlite"
_DISABLED = "none"
_MIB = 1024 * 1024
_UNNAMED_JOB = attrs.fields(MasterConfig).job_name.default


def add_profile_flags(parser: argparse.ArgumentParser, *, sized_by: str = "neither --nnodes nor --node-*") -> None:
    """Add the job profile flags (`--profile-store`, `--job-kind`) to `parser`; `sized_by` names the flags a job
    planned from profiles gives none of."""
    parser.add_argument(
        "--profile-store",
        default=None,
        help=f"the job profile store (SQLite): the job's profile is recorded there at its end, and a job given "
        f"{sized_by} is planned from it; 'none' disables it (default: ${PROFILE_STORE_ENV_VAR}, "
        "else $XDG_CACHE_HOME/dlrover/profiles.sqlite, i.e. ~/.cache/dlrover/profiles.sqlite)",
    )
    parser.add_argument(
        "--job-kind",
        default="",
        help="a tag naming which earlier jobs are like this one: a job planned from profiles uses only profiles of "
        "its kind (without one: the same script or job name)",
    )


def default_profile_store(env: Mapping[str, str] | None = None) -> str:
    """`$XDG_CACHE_HOME/dlrover/profiles.sqlite`, or `~/.cache/dlrover/profiles.sqlite` without it."""
    environ = os.environ if env is None else env
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache) / "dlrover" / DEFAULT_PROFILE_STORE_NAME)


def resolve_profile_store(value: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The profile store to use: `value` (a flag), else `$DLROVER_PROFILE_STORE`, else `default_profile_store()`;
    None when the one chosen is `none` (no profiles recorded or used).

    Raises:
        ConfigError: the chosen value is empty.
    """
    environ = os.environ if env is None else env
    source, chosen = "--profile-store", value
    if chosen is None:
        source, chosen = PROFILE_STORE_ENV_VAR, environ.get(PROFILE_STORE_ENV_VAR)
    if chosen is None:
        return default_profile_store(environ)
    if not chosen.strip():
        raise ConfigError(f"{source} must be a file path or 'none', got {chosen!r}")
    return None if chosen.strip().lower() == _DISABLED else chosen


def script_of(agent_command: Sequence[str]) -> str:
    """The training script of an agent command: its first argument ending in `.py`, as an absolute path ("" when
    there is none, e.g. the external backend's agents or `python -m module`)."""
    for arg in agent_command:
        if arg.endswith(".py") and not arg.startswith("-"):
            return os.path.abspath(arg)
    return ""


def signature_of(config: MasterConfig, job_kind: str = "") -> JobSignature:
    """What is known of the job at submission: its name (unless it is the default name), script and kind."""
    name = "" if config.job_name == _UNNAMED_JOB else config.job_name
    return JobSignature(job_name=name, script=script_of(config.agent_command), job_kind=job_kind)


@attrs.frozen
class JobPlanChoice:
    """Where a job's node count and resources came from; the master announces it at start (`initial_plan` event).

    Attributes:
        source: `profile`, `defaults` or `flags` (explicit flags win; nothing was planned).
        reason: the sentence saying which and why.
        profile_id: the profile it came from (None otherwise).
        nodes: the node count planned.
        resources: the node resources planned (None: nothing asked).
        store_notice: what happened to the profile store ("" when it opened as it was), e.g. set aside.
    """

    source: str
    reason: str
    profile_id: int | None = None
    nodes: int = 1
    resources: Resources | None = None
    store_notice: str = ""

    def to_data(self) -> dict[str, Any]:
        """The event's data."""
        return {
            "source": self.source,
            "profile_id": self.profile_id,
            "nodes": self.nodes,
            "resources": None if self.resources is None else self.resources.to_json(),
            "store_notice": self.store_notice,
        }


def plan_job(
    config: MasterConfig,
    *,
    nodes_given: bool,
    resources_given: bool,
    wall_time: float,
    plan_config: RunPlanConfig | None = None,
    look_only: bool = False,
) -> tuple[MasterConfig, JobPlanChoice]:
    """Size a job from the profile store when it asked for neither node counts nor resources.

    Explicit flags always win: when `nodes_given` or `resources_given`, `config` comes back sized as it is (source
    `flags`, announced as such). Otherwise the node range and resources come from the most similar earlier
    profile, else from the defaults (one node, nothing asked). A store that cannot be read never stops the job: it
    is set aside and the defaults are used, and the choice's `store_notice` says so.

    Args:
        config: the job as submitted (`profile_store` names the store; None: no store, the defaults).
        nodes_given: whether the node count was given (`--nnodes`).
        resources_given: whether any node resource was given (`--node-*`).
        wall_time: now, in wall-clock seconds (names a set-aside file).
        plan_config: the defaults and limits (the local backend's slots cap the count by default).
        look_only: change nothing in the store (`dlrover-master plan`): neither create it nor set it aside.

    Returns:
        The configuration to run and the choice to announce.
    """
    if nodes_given or resources_given:
        given = [w for w, g in (("--nnodes", nodes_given), ("--node-*", resources_given)) if g]
        reason = f"sized by the flags given ({' and '.join(given)}); no profile was consulted"
        flagged = JobPlanChoice(
            "flags", reason, None, config.lifecycle.nodes.max_nodes, config.lifecycle.node_resources
        )
        return attrs.evolve(config, initial_plan=flagged), flagged
    cfg = plan_config or RunPlanConfig(max_nodes=config.local_slots or None)
    runs, notes, notice = read_profiles(config.profile_store, wall_time, look_only=look_only)
    plan = plan_from_runs(runs, signature_of(config, config.job_kind), cfg, notes=notes)
    unit = plan.node_unit if plan.node_unit <= plan.nodes else 1
    lifecycle = attrs.evolve(
        config.lifecycle,
        nodes=NodeRange(min_nodes=plan.min_nodes, max_nodes=plan.nodes, node_unit=unit),
        node_resources=plan.resources,
    )
    choice = JobPlanChoice(
        plan.source,
        plan.reason,
        None if plan.profile is None else plan.profile.profile_id,
        plan.nodes,
        plan.resources,
        notice,
    )
    return attrs.evolve(config, lifecycle=lifecycle, initial_plan=choice), choice


def read_profiles(
    path: str | None, wall_time: float, *, look_only: bool = False
) -> tuple[list[RunProfile], list[str], str]:
    """Every profile in the store at `path`, the sentences a plan's reason should carry (rows skipped, a store
    that could not be read) and what happened to the store ("" when it opened as it was). Never raises for the
    store: one that cannot be read is set aside (unless `look_only`) and no profile comes back.

    Args:
        path: the store (None: none is used).
        wall_time: now, in wall-clock seconds (names a set-aside file).
        look_only: change nothing in the store: neither create it nor set it aside.
    """
    if path is None:
        return [], ["no profile store is used"], ""
    notes: list[str] = []
    runs: list[RunProfile] = []
    opened = open_or_set_aside(path, wall_time, look_only=look_only)
    if opened.notice:
        notes.append("the profile store could not be read, so no profile was used")
    if opened.store is not None:
        try:
            runs, bad = read_runs(opened.store)
            notes.extend(bad)
        except DLRoverError as exc:
            notes.append(f"{exc}: the defaults are used")
        finally:
            opened.store.close()
    return runs, notes, opened.notice


def defaults_instead(config: MasterConfig, why: str) -> MasterConfig:
    """`config` sized by the defaults (one node, nothing asked) because its planned size cannot be used (`why`),
    e.g. a profile recorded on a larger host asks for more than any node of this backend has."""
    reason = f"{why}; starting from the defaults instead, 1 node(s) of nothing asked"
    choice = JobPlanChoice("defaults", reason, None, 1, None)
    lifecycle = attrs.evolve(config.lifecycle, nodes=NodeRange(1, 1, 1), node_resources=None)
    return attrs.evolve(config, lifecycle=lifecycle, initial_plan=choice)


def _int_field(doc: Mapping[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _read_json(path: Path) -> tuple[dict[str, Any] | None, str]:
    """A JSON object from a local file, or None and what is wrong."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, "is not a local file"
    except (OSError, ValueError) as exc:
        return None, f"cannot be read: {exc}"
    return (doc, "") if isinstance(doc, dict) else (None, "is not a JSON object")


def checkpoint_sizes(path: str) -> tuple[int | None, int | None, int | None, str]:
    """The parameter count, one rank's state bytes and the whole checkpoint's bytes of a committed checkpoint, and
    a sentence saying where they came from or why they are missing.

    `path` is the step directory a checkpoint saver committed (`<storage_dir>/<step>`, what `dlrover-run` reports).
    Its `manifest.json` (see `dlrover.flashckpt.ckpt_format`) gives every rank's file bytes (or, for a sharded DCP
    checkpoint, every file's); rank 0's `rank_00000.json` gives its tensors. The parameter count is the number of
    elements of rank 0's tensors under the state's top-level `model` key, or of all its tensors when the state has
    no such key (a model's state dict saved as it is). A sharded checkpoint's parameter count is not recorded (its
    tensor shapes are in DCP's own metadata, which the master does not read).
    """
    step_dir = Path(path)
    manifest = step_dir / "manifest.json"
    doc, problem = _read_json(manifest)
    if doc is None:
        return None, None, None, f"no sizes recorded: the checkpoint's manifest {manifest} {problem}"
    if isinstance(doc.get("files"), dict):  # a sharded (DCP) checkpoint
        sizes = [_int_field(f, "bytes") for f in doc["files"].values() if isinstance(f, dict)]
        total = sum(s for s in sizes if s is not None) if sizes else None
        return None, None, total, f"checkpoint bytes from the sharded checkpoint's {manifest}; parameter count unknown"
    ranks = doc.get("ranks")
    if not isinstance(ranks, list):
        return None, None, None, f"no sizes recorded: {manifest} lists no ranks"
    file_sizes = [_int_field(r, "file_bytes") for r in ranks if isinstance(r, dict)]
    total = sum(s for s in file_sizes if s is not None) if file_sizes else None
    rank0 = step_dir / "rank_00000.json"
    rdoc, problem = _read_json(rank0)
    raw = rdoc.get("tensors") if rdoc is not None else None
    if not isinstance(raw, list):
        problem = problem or "lists no tensors"
        return None, None, total, f"checkpoint bytes from {manifest}; rank 0's manifest {rank0} {problem}"
    tensors = [t for t in raw if isinstance(t, dict)]
    state_bytes = sum(_int_field(t, "nbytes") or 0 for t in tensors)
    model = [t for t in tensors if str(t.get("name", "")).startswith("model/")]
    counted = model or tensors
    params = 0
    for t in counted:
        shape = t.get("shape")
        if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
            params += math.prod(shape)
    which = "its 'model' tensors" if model else "all its tensors (no 'model' key)"
    return params, state_bytes, total, f"from the checkpoint at {path}: parameters of {which}, sizes from {manifest}"


class ThroughputBySize:
    """Samples per second at each node count, from the job's running sample total. Pure: times are passed in.

    Between two observations at the same node count the samples added and the time passed count for that count;
    a count's time starts once its first samples arrive (a round's start-up is not throughput).
    """

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None  # (wall time, total samples, nodes)
        self._sums: dict[int, list[float]] = {}  # nodes -> [samples, seconds]

    def observe(self, wall_time: float, total_samples: int, nodes: int) -> None:
        """The job had consumed `total_samples` in all at `wall_time`, with `nodes` nodes running."""
        last, self._last = self._last, (wall_time, total_samples, nodes)
        if last is None or nodes < 1 or last[2] != nodes or wall_time <= last[0]:
            return
        added = total_samples - last[1]
        if added <= 0 and nodes not in self._sums:
            return
        acc = self._sums.setdefault(nodes, [0.0, 0.0])
        acc[0] += max(added, 0)
        acc[1] += wall_time - last[0]

    def rates(self) -> dict[int, float]:
        """Samples per second by node count (counts with samples only)."""
        return {n: s / t for n, (s, t) in sorted(self._sums.items()) if t > 0 and s > 0}


class ProfileRecorder:
    """Records a finished job's profile in the store at `path`, opened only for the write.

    Args:
        path: the store's file.
    """

    def __init__(self, path: str) -> None:
        self._path = path

    @property
    def path(self) -> str:
        """The store's file."""
        return self._path

    def record(self, profile: RunProfile, wall_time: float) -> tuple[int | None, str]:
        """Store `profile`; returns its id (None when it was not stored) and a sentence saying what happened.

        Never raises for the store: an unreadable store is set aside first, a refused write is reported.
        """
        opened = open_or_set_aside(self._path, wall_time)
        prefix = f"{opened.notice}; " if opened.notice else ""
        if opened.store is None:
            return None, f"{prefix}the job's profile was not recorded"
        try:
            pid = add_run(opened.store, profile)
        except DLRoverError as exc:
            return None, f"{prefix}the job's profile was not recorded: {exc}"
        finally:
            opened.store.close()
        return pid, f"{prefix}profile {pid} recorded in {self._path}"


def build_run_profile(
    config: MasterConfig,
    *,
    outcome: str,
    exit_reason: str,
    launched: Sequence[Resources | None],
    final_nodes: int,
    throughput: Mapping[int, float],
    peak_memory_bytes: Mapping[int, int],
    peak_gpu_memory_bytes: Mapping[int, int],
    checkpoint_path: str | None,
    wall_time: float,
) -> RunProfile:
    """The profile of a finished job from what its master measured.

    Args:
        config: the job's configuration.
        outcome: its final state's name.
        exit_reason: why it ended.
        launched: the resources each of its nodes was launched with; the one with the most memory is kept (a node
            grown after a host OOM shows what the job needed), else `config`'s.
        final_nodes: the node count it was sized to at the end.
        throughput: samples per second by node count (`ThroughputBySize.rates`).
        peak_memory_bytes: each node's peak host memory.
        peak_gpu_memory_bytes: each node's peak accelerator memory (nodes that reported none left out).
        checkpoint_path: the last committed checkpoint's step directory (None: none was committed).
        wall_time: now.
    """
    asked = [r for r in launched if r is not None]
    resources = (
        max(asked, key=lambda r: (r.memory_mb, r.cpu_milli, r.gpu)) if asked else config.lifecycle.node_resources
    )
    if checkpoint_path is None:
        params, state, total, note = None, None, None, "no sizes recorded: the job committed no checkpoint"
    else:
        params, state, total, note = checkpoint_sizes(checkpoint_path)
    nodes = config.lifecycle.nodes
    return RunProfile(
        signature=signature_of(config, config.job_kind),
        outcome=outcome,
        exit_reason=exit_reason,
        node_resources=resources,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        node_unit=nodes.node_unit,
        final_nodes=final_nodes,
        throughput=tuple(throughput.items()),
        peak_memory_mb=tuple((n, round(b / _MIB, 1)) for n, b in peak_memory_bytes.items()),
        peak_gpu_memory_mb=tuple((n, round(b / _MIB, 1)) for n, b in peak_gpu_memory_bytes.items() if b > 0),
        parameter_count=params,
        state_bytes=state,
        checkpoint_bytes=total,
        checkpoint_note=note,
        finished_at=wall_time,
    )
