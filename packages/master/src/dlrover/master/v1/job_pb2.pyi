from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetJobStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "rank", "state", "name", "host", "relaunch_count", "process_restarts", "step", "seconds_since_heartbeat", "last_failure", "last_reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROCESS_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    rank: int
    state: str
    name: str
    host: str
    relaunch_count: int
    process_restarts: int
    step: int
    seconds_since_heartbeat: float
    last_failure: str
    last_reason: str
    def __init__(self, node_id: _Optional[int] = ..., rank: _Optional[int] = ..., state: _Optional[str] = ..., name: _Optional[str] = ..., host: _Optional[str] = ..., relaunch_count: _Optional[int] = ..., process_restarts: _Optional[int] = ..., step: _Optional[int] = ..., seconds_since_heartbeat: _Optional[float] = ..., last_failure: _Optional[str] = ..., last_reason: _Optional[str] = ...) -> None: ...

class GetJobStatusResponse(_message.Message):
    __slots__ = ("job_name", "state", "exit_reason", "nodes", "min_nodes", "max_nodes", "job_failures", "step", "has_committed_step", "committed_step", "goodput", "elapsed_s", "total_relaunches", "samples_per_second", "useful_s", "goodput_buckets", "committed_path", "committed_wall_time", "target_nodes", "wanted_nodes", "capacity", "spares", "spare_nodes")
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_REASON_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    JOB_FAILURES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HAS_COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RELAUNCHES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    USEFUL_S_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_PATH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_WALL_TIME_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODES_FIELD_NUMBER: _ClassVar[int]
    WANTED_NODES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    SPARE_NODES_FIELD_NUMBER: _ClassVar[int]
    job_name: str
    state: str
    exit_reason: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    min_nodes: int
    max_nodes: int
    job_failures: int
    step: int
    has_committed_step: bool
    committed_step: int
    goodput: float
    elapsed_s: float
    total_relaunches: int
    samples_per_second: float
    useful_s: float
    goodput_buckets: _containers.RepeatedCompositeFieldContainer[GoodputBucket]
    committed_path: str
    committed_wall_time: float
    target_nodes: int
    wanted_nodes: int
    capacity: int
    spares: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    spare_nodes: int
    def __init__(self, job_name: _Optional[str] = ..., state: _Optional[str] = ..., exit_reason: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., job_failures: _Optional[int] = ..., step: _Optional[int] = ..., has_committed_step: _Optional[bool] = ..., committed_step: _Optional[int] = ..., goodput: _Optional[float] = ..., elapsed_s: _Optional[float] = ..., total_relaunches: _Optional[int] = ..., samples_per_second: _Optional[float] = ..., useful_s: _Optional[float] = ..., goodput_buckets: _Optional[_Iterable[_Union[GoodputBucket, _Mapping]]] = ..., committed_path: _Optional[str] = ..., committed_wall_time: _Optional[float] = ..., target_nodes: _Optional[int] = ..., wanted_nodes: _Optional[int] = ..., capacity: _Optional[int] = ..., spares: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., spare_nodes: _Optional[int] = ...) -> None: ...

class GoodputBucket(_message.Message):
    __slots__ = ("name", "seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    seconds: float
    def __init__(self, name: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("after_seq", "limit")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    limit: int
    def __init__(self, after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("seq", "wall_time", "kind", "message", "has_node", "node_id", "rank", "data_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HAS_NODE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    wall_time: float
    kind: str
    message: str
    has_node: bool
    node_id: int
    rank: int
    data_json: str
    def __init__(self, seq: _Optional[int] = ..., wall_time: _Optional[float] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., has_node: _Optional[bool] = ..., node_id: _Optional[int] = ..., rank: _Optional[int] = ..., data_json: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ...) -> None: ...

class StopJobRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StopJobResponse(_message.Message):
    __slots__ = ("state", "exit_reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_REASON_FIELD_NUMBER: _ClassVar[int]
    state: str
    exit_reason: str
    def __init__(self, state: _Optional[str] = ..., exit_reason: _Optional[str] = ...) -> None: ...

class ResizeJobRequest(_message.Message):
    __slots__ = ("target", "reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    target: int
    reason: str
    def __init__(self, target: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ResizeJobResponse(_message.Message):
    __slots__ = ("wanted_nodes", "target_nodes", "placeable", "launched_ranks", "leaving_nodes", "message")
    WANTED_NODES_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODES_FIELD_NUMBER: _ClassVar[int]
    PLACEABLE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHED_RANKS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_NODES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    wanted_nodes: int
    target_nodes: int
    placeable: int
    launched_ranks: _containers.RepeatedScalarFieldContainer[int]
    leaving_nodes: _containers.RepeatedScalarFieldContainer[int]
    message: str
    def __init__(self, wanted_nodes: _Optional[int] = ..., target_nodes: _Optional[int] = ..., placeable: _Optional[int] = ..., launched_ranks: _Optional[_Iterable[int]] = ..., leaving_nodes: _Optional[_Iterable[int]] = ..., message: _Optional[str] = ...) -> None: ...

class SetCapacityRequest(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    def __init__(self, slots: _Optional[int] = ...) -> None: ...

class SetCapacityResponse(_message.Message):
    __slots__ = ("capacity",)
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    def __init__(self, capacity: _Optional[int] = ...) -> None: ...
