"""TensorFlow parameter-server jobs: a chief, parameter servers and workers, each relaunched at its address.

`PsJobMaster` runs one on a scheduler backend (`dlrover-master ps-job` on this host); `PsJobCore` is its pure
decision core; `tf_config` builds a task's `TF_CONFIG`. The chief's program reads its data from the master's
shard service (`dlrover.shard.tf_data`) and restores from its newest checkpoint when it starts again.
"""

from dlrover.master.psjob.core import JobOutcome, Launch, PsDecision, PsEvent, PsJobCore, Stop, TaskPhase
from dlrover.master.psjob.node import ADDRESS_IN_USE_EXIT_CODE
from dlrover.master.psjob.ports import task_ports
from dlrover.master.psjob.progress import Rewind, RewindWatchingServicer
from dlrover.master.psjob.runner import TASK_ENV_VAR, PsJobConfig, PsJobMaster
from dlrover.master.psjob.spec import PS_ROLES, PsJobSpec, TaskKey, tf_config

__all__ = [
    "ADDRESS_IN_USE_EXIT_CODE",
    "PS_ROLES",
    "TASK_ENV_VAR",
    "JobOutcome",
    "Launch",
    "PsDecision",
    "PsEvent",
    "PsJobConfig",
    "PsJobCore",
    "PsJobMaster",
    "PsJobSpec",
    "Rewind",
    "RewindWatchingServicer",
    "Stop",
    "TaskKey",
    "TaskPhase",
    "task_ports",
    "tf_config",
]
