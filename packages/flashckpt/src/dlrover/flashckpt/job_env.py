"""Who a training process is in its job, from its launcher's environment: job and run ids, rank
and world size. Pure: `resolve_identity` takes the environment, what torch.distributed says and the
launching process, and returns the identity with a sentence saying where each part came from.

Shared memory is named after the job id, the run id and the rank, so the ids must be stable across
restarts of the training processes (a restarted process loads the snapshots its predecessor left)
and different for two jobs on one machine. In order:

* **Job id.** The one given; else ``DLROVER_JOB_ID``, which ``dlrover-run`` gives its workers (the
  agent's run id, stable for as long as the agent runs); else torchrun's ``TORCHELASTIC_RUN_ID``
  (``--standalone``: a fresh uuid per torchrun; else ``--rdzv-id``); when that is torchrun's
  default ``none`` (no ``--rdzv-id``), the torchrun agent itself: the workers' parent process, by
  pid and start time (it restarts the workers and outlives them); with no launcher at all,
  ``local`` (the run id below still tells storage locations apart).
* **Run id.** The one given; else derived from the storage location (``ck-`` and 12 hex digits of
  its SHA-256), so two checkpointers of one job writing to different places never share memory.
* **Rank and world size.** The ones given; else torch.distributed's default group when it is
  initialised; else ``RANK`` and ``WORLD_SIZE`` (both or neither); else one process.

Ids not safe in a file name (``--rdzv-id`` may hold any character) are cleaned and given a hash of
the original, so distinct ids stay distinct (`safe_job_id`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

import attrs

from dlrover.common import ConfigError
from dlrover.common.process import ProcessIdentity

__all__ = [
    "HOST_SOCKET_ENV_VAR",
    "JOB_ID_ENV_VAR",
    "CheckpointIdentity",
    "DistState",
    "current_dist_state",
    "launcher_process",
    "resolve_identity",
    "run_id_for",
    "safe_job_id",
]

JOB_ID_ENV_VAR = "DLROVER_JOB_ID"
"""Names the job to its training processes: ``dlrover-run`` sets it (stable while its agent runs)."""

# Here rather than in `dlrover.flashckpt.host`, which the launcher's worker environment would otherwise
# import with the whole saver: `dlrover-run` reads it before its first standby worker starts.
HOST_SOCKET_ENV_VAR = "DLROVER_FLASHCKPT_HOST"
"""The environment variable naming the agent's `SaverHost` socket to training processes."""

TORCHRUN_RUN_ID_ENV_VAR = "TORCHELASTIC_RUN_ID"
_TORCHRUN_DEFAULT_RUN_ID = "none"  # torchrun's --rdzv-id when none is given (and not --standalone)
LOCAL_JOB_ID = "local"
"""The job id of a process no launcher names (a script run by hand)."""

_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_-]+")


def safe_job_id(text: str) -> str:
    """`text` when it is safe in a segment name (1-64 of ``[A-Za-z0-9_-]``), else a cleaned prefix
    of it plus 12 hex digits of its SHA-256 (distinct texts stay distinct).

    Raises:
        ConfigError: `text` is empty.
    """
    if not text:
        raise ConfigError("a job id cannot be empty")
    if _SAFE.match(text):
        return text
    prefix = _UNSAFE_RUN.sub("-", text).strip("-")[:40] or "job"
    return f"{prefix}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}"


def run_id_for(storage_url: str | None) -> str:
    """The run id of checkpoints written to `storage_url` (``ck`` for a storage no other process
    can open, such as `InMemoryStorage`)."""
    if storage_url is None:
        return "ck"
    return "ck-" + hashlib.sha256(storage_url.encode("utf-8")).hexdigest()[:12]


@attrs.frozen
class DistState:
    """What torch.distributed says about this process.

    Attributes:
        initialized: whether the default process group is up.
        rank: this process's rank in it (0 when not initialised).
        world_size: its size (1 when not initialised).
    """

    initialized: bool
    rank: int = 0
    world_size: int = 1


def current_dist_state() -> DistState:
    """`DistState` of this process (not initialised when torch.distributed is unavailable)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return DistState(False)
    return DistState(True, dist.get_rank(), dist.get_world_size())


def launcher_process() -> ProcessIdentity | None:
    """The parent process (a torchrun agent starts its workers as its children), None when its
    start time cannot be read (no ``/proc``)."""
    return ProcessIdentity.of(os.getppid())


@attrs.frozen
class CheckpointIdentity:
    """Where one process's snapshots live, and why.

    Attributes:
        job_id: names the job in shared memory.
        run_id: names the checkpoint location within the job.
        rank: global rank.
        world_size: processes in the job.
        rank_source: where rank and world size came from (``given``, ``torch.distributed``,
            ``RANK/WORLD_SIZE`` or ``single process``), for error messages.
        reason: where every part came from, in a sentence.
    """

    job_id: str
    run_id: str
    rank: int
    world_size: int
    rank_source: str
    reason: str


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "")
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {text!r}") from None


def _job_id(env: Mapping[str, str], launcher: ProcessIdentity | None) -> tuple[str, str]:
    """The job id from the environment, and where it came from."""
    dlrover = env.get(JOB_ID_ENV_VAR, "")
    if dlrover:
        if not _SAFE.match(dlrover):
            raise ConfigError(f"{JOB_ID_ENV_VAR}={dlrover!r} must be 1-64 characters of [A-Za-z0-9_-]")
        return dlrover, f"{JOB_ID_ENV_VAR} (dlrover-run)"
    run = env.get(TORCHRUN_RUN_ID_ENV_VAR, "")
    if run and run != _TORCHRUN_DEFAULT_RUN_ID:
        return safe_job_id(run), f"{TORCHRUN_RUN_ID_ENV_VAR}={run!r}"
    if run == _TORCHRUN_DEFAULT_RUN_ID:
        if launcher is None:
            raise ConfigError(
                f"{TORCHRUN_RUN_ID_ENV_VAR} is {run!r} (torchrun without --rdzv-id or --standalone) and the "
                "launching process cannot be identified here: pass torchrun --rdzv-id=<a name unique to this "
                "job>, or job_id="
            )
        return (
            f"torchrun-{launcher.pid}-{launcher.start_ticks}",
            f"the torchrun agent (pid {launcher.pid}; {TORCHRUN_RUN_ID_ENV_VAR} is {run!r})",
        )
    return LOCAL_JOB_ID, "no launcher names the job"


def _ranks(env: Mapping[str, str], dist: DistState) -> tuple[int, int, str]:
    """Rank and world size from torch.distributed, else the environment, else one process."""
    if dist.initialized:
        return dist.rank, dist.world_size, "torch.distributed"
    rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    if rank is None and world is None:
        return 0, 1, "single process"
    if rank is None or world is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        given = "WORLD_SIZE" if rank is None else "RANK"
        raise ConfigError(
            f"{given}={env[given]} is set but {missing} is not, and torch.distributed is not initialised: "
            f"set both, initialise torch.distributed first, or pass rank= and world_size="
        )
    return rank, world, "RANK/WORLD_SIZE"


def resolve_identity(
    env: Mapping[str, str],
    dist: DistState,
    *,
    storage_url: str | None,
    launcher: ProcessIdentity | None = None,
    job_id: str | None = None,
    run_id: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> CheckpointIdentity:
    """This process's checkpoint identity (see the module docstring for the order of sources).

    Args:
        env: the process environment.
        dist: what torch.distributed says (`current_dist_state`).
        storage_url: the checkpoint location (`StorageLocation.url`; None for a storage no other
            process can open), from which the run id is derived.
        launcher: the parent process (`launcher_process`), used only under torchrun without a run id.
        job_id: overrides the job id from the environment.
        run_id: overrides the run id derived from `storage_url`.
        rank: overrides the rank (from torch.distributed or ``RANK``).
        world_size: overrides the world size (from torch.distributed or ``WORLD_SIZE``).

    Raises:
        ConfigError: the environment is ambiguous or malformed (only one of ``RANK`` and
            ``WORLD_SIZE``, a non-integer, a rank outside the world, an unsafe
            ``DLROVER_JOB_ID``, torchrun without a run id nor an identifiable agent), naming
            what is missing.
    """
    parts = []
    if job_id is None:
        job_id, why = _job_id(env, launcher)
        parts.append(f"job id {job_id!r} from {why}")
    else:
        parts.append(f"job id {job_id!r} given")
    if run_id is None:
        run_id = run_id_for(storage_url)
        parts.append(f"run id {run_id!r} from the storage location")
    else:
        parts.append(f"run id {run_id!r} given")
    if rank is None or world_size is None:
        found_rank, found_world, source = _ranks(env, dist)
        if source == "single process" and (rank, world_size) != (None, None):
            # Half of a pair given with nothing to complete it: a default would be a guess.
            missing = "world_size" if world_size is None else "rank"
            raise ConfigError(
                f"{'rank' if missing == 'world_size' else 'world_size'}= was given but not {missing}=, and "
                "nothing else says it (torch.distributed is not initialised, RANK/WORLD_SIZE are not set)"
            )
        if rank is not None or world_size is not None:
            source = f"{source} and given"
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    else:
        source = "given"
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not within world size {world_size} (from {source})")
    parts.append(f"rank {rank} of {world_size} from {source}")
    return CheckpointIdentity(job_id, run_id, rank, world_size, source, "; ".join(parts))
