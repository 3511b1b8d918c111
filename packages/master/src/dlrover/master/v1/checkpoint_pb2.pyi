from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankSteps(_message.Message):
    __slots__ = ("rank", "steps")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    steps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rank: _Optional[int] = ..., steps: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportCheckpointStepsRequest(_message.Message):
    __slots__ = ("node_id", "world_size", "ranks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    world_size: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankSteps]
    def __init__(self, node_id: _Optional[int] = ..., world_size: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankSteps, _Mapping]]] = ...) -> None: ...

class ReportCheckpointStepsResponse(_message.Message):
    __slots__ = ("has_complete_step", "complete_step", "has_committed_step", "committed_step")
    HAS_COMPLETE_STEP_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_STEP_FIELD_NUMBER: _ClassVar[int]
    HAS_COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    has_complete_step: bool
    complete_step: int
    has_committed_step: bool
    committed_step: int
    def __init__(self, has_complete_step: _Optional[bool] = ..., complete_step: _Optional[int] = ..., has_committed_step: _Optional[bool] = ..., committed_step: _Optional[int] = ...) -> None: ...

class CommitCheckpointRequest(_message.Message):
    __slots__ = ("node_id", "step", "path", "world_size")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    step: int
    path: str
    world_size: int
    def __init__(self, node_id: _Optional[int] = ..., step: _Optional[int] = ..., path: _Optional[str] = ..., world_size: _Optional[int] = ...) -> None: ...

class CommitCheckpointResponse(_message.Message):
    __slots__ = ("committed_step",)
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    committed_step: int
    def __init__(self, committed_step: _Optional[int] = ...) -> None: ...
