from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ActionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_KIND_UNSPECIFIED: _ClassVar[ActionKind]
    ACTION_KIND_RESTART_PROCESSES: _ClassVar[ActionKind]
    ACTION_KIND_REMOVE_NODE: _ClassVar[ActionKind]
    ACTION_KIND_NONE: _ClassVar[ActionKind]
    ACTION_KIND_ROLLBACK_CHECKPOINT: _ClassVar[ActionKind]
    ACTION_KIND_RELAUNCH_NODE: _ClassVar[ActionKind]
    ACTION_KIND_RELAUNCH_WITH_MORE_MEMORY: _ClassVar[ActionKind]
    ACTION_KIND_ABORT_JOB: _ClassVar[ActionKind]

class FailureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_KIND_UNSPECIFIED: _ClassVar[FailureKind]
    FAILURE_KIND_USER_CODE: _ClassVar[FailureKind]
    FAILURE_KIND_HOST_OOM: _ClassVar[FailureKind]
    FAILURE_KIND_HARDWARE: _ClassVar[FailureKind]
    FAILURE_KIND_COMMUNICATION: _ClassVar[FailureKind]
    FAILURE_KIND_HANG: _ClassVar[FailureKind]
    FAILURE_KIND_UNKNOWN: _ClassVar[FailureKind]
    FAILURE_KIND_DEVICE_OOM: _ClassVar[FailureKind]
    FAILURE_KIND_NAN_LOSS: _ClassVar[FailureKind]
    FAILURE_KIND_PREEMPTION: _ClassVar[FailureKind]
    FAILURE_KIND_KILLED: _ClassVar[FailureKind]
    FAILURE_KIND_DATA_ERROR: _ClassVar[FailureKind]
    FAILURE_KIND_NATIVE_CRASH: _ClassVar[FailureKind]
    FAILURE_KIND_DISK_FULL: _ClassVar[FailureKind]
    FAILURE_KIND_CONFIG_ERROR: _ClassVar[FailureKind]
ACTION_KIND_UNSPECIFIED: ActionKind
ACTION_KIND_RESTART_PROCESSES: ActionKind
ACTION_KIND_REMOVE_NODE: ActionKind
ACTION_KIND_NONE: ActionKind
ACTION_KIND_ROLLBACK_CHECKPOINT: ActionKind
ACTION_KIND_RELAUNCH_NODE: ActionKind
ACTION_KIND_RELAUNCH_WITH_MORE_MEMORY: ActionKind
ACTION_KIND_ABORT_JOB: ActionKind
FAILURE_KIND_UNSPECIFIED: FailureKind
FAILURE_KIND_USER_CODE: FailureKind
FAILURE_KIND_HOST_OOM: FailureKind
FAILURE_KIND_HARDWARE: FailureKind
FAILURE_KIND_COMMUNICATION: FailureKind
FAILURE_KIND_HANG: FailureKind
FAILURE_KIND_UNKNOWN: FailureKind
FAILURE_KIND_DEVICE_OOM: FailureKind
FAILURE_KIND_NAN_LOSS: FailureKind
FAILURE_KIND_PREEMPTION: FailureKind
FAILURE_KIND_KILLED: FailureKind
FAILURE_KIND_DATA_ERROR: FailureKind
FAILURE_KIND_NATIVE_CRASH: FailureKind
FAILURE_KIND_DISK_FULL: FailureKind
FAILURE_KIND_CONFIG_ERROR: FailureKind

class ResourceSample(_message.Message):
    __slots__ = ("cpu_percent", "memory_bytes", "gpu_percent", "gpu_memory_bytes")
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_percent: float
    memory_bytes: int
    gpu_percent: float
    gpu_memory_bytes: int
    def __init__(self, cpu_percent: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., gpu_percent: _Optional[float] = ..., gpu_memory_bytes: _Optional[int] = ...) -> None: ...

class StepProgress(_message.Message):
    __slots__ = ("step", "samples")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    step: int
    samples: int
    def __init__(self, step: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class RankStepStats(_message.Message):
    __slots__ = ("rank", "steps", "samples", "median_step_s", "since_step_s", "phase", "median_sync_lead_s", "steps_per_mark", "sync_group")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_STEP_S_FIELD_NUMBER: _ClassVar[int]
    SINCE_STEP_S_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_SYNC_LEAD_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_MARK_FIELD_NUMBER: _ClassVar[int]
    SYNC_GROUP_FIELD_NUMBER: _ClassVar[int]
    rank: int
    steps: int
    samples: int
    median_step_s: float
    since_step_s: float
    phase: str
    median_sync_lead_s: float
    steps_per_mark: float
    sync_group: int
    def __init__(self, rank: _Optional[int] = ..., steps: _Optional[int] = ..., samples: _Optional[int] = ..., median_step_s: _Optional[float] = ..., since_step_s: _Optional[float] = ..., phase: _Optional[str] = ..., median_sync_lead_s: _Optional[float] = ..., steps_per_mark: _Optional[float] = ..., sync_group: _Optional[int] = ...) -> None: ...

class StepMark(_message.Message):
    __slots__ = ("step", "end_time", "save_s", "samples")
    STEP_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    SAVE_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    step: int
    end_time: float
    save_s: float
    samples: int
    def __init__(self, step: _Optional[int] = ..., end_time: _Optional[float] = ..., save_s: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class AttemptReport(_message.Message):
    __slots__ = ("attempt", "rank", "rendezvous_start", "rendezvous_end", "workers_start", "ready_time", "load_s", "marks")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_START_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_END_FIELD_NUMBER: _ClassVar[int]
    WORKERS_START_FIELD_NUMBER: _ClassVar[int]
    READY_TIME_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    MARKS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    rendezvous_start: float
    rendezvous_end: float
    workers_start: float
    ready_time: float
    load_s: float
    marks: _containers.RepeatedCompositeFieldContainer[StepMark]
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., rendezvous_start: _Optional[float] = ..., rendezvous_end: _Optional[float] = ..., workers_start: _Optional[float] = ..., ready_time: _Optional[float] = ..., load_s: _Optional[float] = ..., marks: _Optional[_Iterable[_Union[StepMark, _Mapping]]] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "node_name", "host", "local_world_size", "max_restarts", "registration_key")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_KEY_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    node_name: str
    host: str
    local_world_size: int
    max_restarts: int
    registration_key: str
    def __init__(self, node_id: _Optional[int] = ..., node_name: _Optional[str] = ..., host: _Optional[str] = ..., local_world_size: _Optional[int] = ..., max_restarts: _Optional[int] = ..., registration_key: _Optional[str] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node_id", "rank", "node_credential", "heartbeat_interval_s", "heartbeat_timeout_s", "relaunch_count", "min_nodes", "max_nodes", "node_unit")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_UNIT_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    rank: int
    node_credential: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    relaunch_count: int
    min_nodes: int
    max_nodes: int
    node_unit: int
    def __init__(self, node_id: _Optional[int] = ..., rank: _Optional[int] = ..., node_credential: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., heartbeat_timeout_s: _Optional[float] = ..., relaunch_count: _Optional[int] = ..., min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., node_unit: _Optional[int] = ...) -> None: ...

class HangExcuse(_message.Message):
    __slots__ = ("began_s_ago", "remaining_s", "why")
    BEGAN_S_AGO_FIELD_NUMBER: _ClassVar[int]
    REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    began_s_ago: float
    remaining_s: float
    why: str
    def __init__(self, began_s_ago: _Optional[float] = ..., remaining_s: _Optional[float] = ..., why: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "resources", "progress", "rank_steps", "attempts", "excuses")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RANK_STEPS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    EXCUSES_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    resources: ResourceSample
    progress: StepProgress
    rank_steps: _containers.RepeatedCompositeFieldContainer[RankStepStats]
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptReport]
    excuses: _containers.RepeatedCompositeFieldContainer[HangExcuse]
    def __init__(self, node_id: _Optional[int] = ..., resources: _Optional[_Union[ResourceSample, _Mapping]] = ..., progress: _Optional[_Union[StepProgress, _Mapping]] = ..., rank_steps: _Optional[_Iterable[_Union[RankStepStats, _Mapping]]] = ..., attempts: _Optional[_Iterable[_Union[AttemptReport, _Mapping]]] = ..., excuses: _Optional[_Iterable[_Union[HangExcuse, _Mapping]]] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("action_id", "kind", "reason", "planned_round")
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLANNED_ROUND_FIELD_NUMBER: _ClassVar[int]
    action_id: int
    kind: ActionKind
    reason: str
    planned_round: bool
    def __init__(self, action_id: _Optional[int] = ..., kind: _Optional[_Union[ActionKind, str]] = ..., reason: _Optional[str] = ..., planned_round: _Optional[bool] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("actions", "job_state", "peer_excuses")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    PEER_EXCUSES_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[Action]
    job_state: str
    peer_excuses: _containers.RepeatedCompositeFieldContainer[HangExcuse]
    def __init__(self, actions: _Optional[_Iterable[_Union[Action, _Mapping]]] = ..., job_state: _Optional[str] = ..., peer_excuses: _Optional[_Iterable[_Union[HangExcuse, _Mapping]]] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("node_id", "kind", "evidence", "exit_code", "agent_exits")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_EXITS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    kind: FailureKind
    evidence: str
    exit_code: int
    agent_exits: bool
    def __init__(self, node_id: _Optional[int] = ..., kind: _Optional[_Union[FailureKind, str]] = ..., evidence: _Optional[str] = ..., exit_code: _Optional[int] = ..., agent_exits: _Optional[bool] = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ("reason", "action", "kind", "avoid_host")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AVOID_HOST_FIELD_NUMBER: _ClassVar[int]
    reason: str
    action: ActionKind
    kind: FailureKind
    avoid_host: bool
    def __init__(self, reason: _Optional[str] = ..., action: _Optional[_Union[ActionKind, str]] = ..., kind: _Optional[_Union[FailureKind, str]] = ..., avoid_host: _Optional[bool] = ...) -> None: ...

class ReportSuccessRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class ReportSuccessResponse(_message.Message):
    __slots__ = ("job_state",)
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    job_state: str
    def __init__(self, job_state: _Optional[str] = ...) -> None: ...
