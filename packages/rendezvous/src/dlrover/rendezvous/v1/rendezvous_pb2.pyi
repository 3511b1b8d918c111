from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PollState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLL_STATE_UNSPECIFIED: _ClassVar[PollState]
    POLL_STATE_WAITING: _ClassVar[PollState]
    POLL_STATE_ASSIGNED: _ClassVar[PollState]
    POLL_STATE_NOT_WAITING: _ClassVar[PollState]
    POLL_STATE_TIMED_OUT: _ClassVar[PollState]
    POLL_STATE_CLOSED: _ClassVar[PollState]
POLL_STATE_UNSPECIFIED: PollState
POLL_STATE_WAITING: PollState
POLL_STATE_ASSIGNED: PollState
POLL_STATE_NOT_WAITING: PollState
POLL_STATE_TIMED_OUT: PollState
POLL_STATE_CLOSED: PollState

class JoinRequest(_message.Message):
    __slots__ = ("node_id", "min_nodes", "max_nodes", "topology_key", "local_world_size")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_KEY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    min_nodes: int
    max_nodes: int
    topology_key: str
    local_world_size: int
    def __init__(self, node_id: _Optional[str] = ..., min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., topology_key: _Optional[str] = ..., local_world_size: _Optional[int] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("accepted", "round", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    round: int
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., round: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PollRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class PollResponse(_message.Message):
    __slots__ = ("state", "round", "rank", "world_size", "reason", "first_worker_rank", "worker_world_size", "spare", "retry_after_s")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIRST_WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    WORKER_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SPARE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    state: PollState
    round: int
    rank: int
    world_size: int
    reason: str
    first_worker_rank: int
    worker_world_size: int
    spare: bool
    retry_after_s: float
    def __init__(self, state: _Optional[_Union[PollState, str]] = ..., round: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., reason: _Optional[str] = ..., first_worker_rank: _Optional[int] = ..., worker_world_size: _Optional[int] = ..., spare: _Optional[bool] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known", "reason")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    known: bool
    reason: str
    def __init__(self, known: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class NumNodesWaitingRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NumNodesWaitingResponse(_message.Message):
    __slots__ = ("num_nodes_waiting", "retry_after_s", "rounds_formed")
    NUM_NODES_WAITING_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FORMED_FIELD_NUMBER: _ClassVar[int]
    num_nodes_waiting: int
    retry_after_s: float
    rounds_formed: int
    def __init__(self, num_nodes_waiting: _Optional[int] = ..., retry_after_s: _Optional[float] = ..., rounds_formed: _Optional[int] = ...) -> None: ...

class AnnounceRestartRequest(_message.Message):
    __slots__ = ("node_id", "nodes_waiting", "round")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_WAITING_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    nodes_waiting: int
    round: int
    def __init__(self, node_id: _Optional[str] = ..., nodes_waiting: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class AnnounceRestartResponse(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: bool
    def __init__(self, recorded: _Optional[bool] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class GetWorldRequest(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class GetWorldResponse(_message.Message):
    __slots__ = ("round", "members", "reason")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round: int
    members: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, round: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("closed", "round", "num_nodes_waiting", "min_nodes", "max_nodes", "reason")
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_WAITING_FIELD_NUMBER: _ClassVar[int]
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    round: int
    num_nodes_waiting: int
    min_nodes: int
    max_nodes: int
    reason: str
    def __init__(self, closed: _Optional[bool] = ..., round: _Optional[int] = ..., num_nodes_waiting: _Optional[int] = ..., min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvSetRequest(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class KvSetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvGetRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class KvGetResponse(_message.Message):
    __slots__ = ("found", "values")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    found: _containers.RepeatedScalarFieldContainer[bool]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, found: _Optional[_Iterable[bool]] = ..., values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class KvAddRequest(_message.Message):
    __slots__ = ("key", "amount")
    KEY_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    key: str
    amount: int
    def __init__(self, key: _Optional[str] = ..., amount: _Optional[int] = ...) -> None: ...

class KvAddResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class KvCompareSetRequest(_message.Message):
    __slots__ = ("key", "expected", "desired")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    key: str
    expected: bytes
    desired: bytes
    def __init__(self, key: _Optional[str] = ..., expected: _Optional[bytes] = ..., desired: _Optional[bytes] = ...) -> None: ...

class KvCompareSetResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class KvCheckRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class KvCheckResponse(_message.Message):
    __slots__ = ("all_set",)
    ALL_SET_FIELD_NUMBER: _ClassVar[int]
    all_set: bool
    def __init__(self, all_set: _Optional[bool] = ...) -> None: ...

class KvDeleteRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class KvDeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class KvNumKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvNumKeysResponse(_message.Message):
    __slots__ = ("num_keys",)
    NUM_KEYS_FIELD_NUMBER: _ClassVar[int]
    num_keys: int
    def __init__(self, num_keys: _Optional[int] = ...) -> None: ...
