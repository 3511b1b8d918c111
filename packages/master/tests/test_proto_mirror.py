"""The protocol's enums mirror dlrover.diagnosis' one to one, converted by name.

A kind or action added to dlrover.diagnosis fails here until agent.proto has its value (and the
generated code is regenerated with tools/gen_proto.py).
"""

from __future__ import annotations

import enum

import pytest

from dlrover.diagnosis import ActionKind, FailureKind
from dlrover.master.v1 import agent_pb2
from dlrover.master.wire import WireEnumError, from_proto, proto_prefix, to_proto

pytestmark = pytest.mark.timeout(30)

MIRRORS = [(FailureKind, agent_pb2.FailureKind), (ActionKind, agent_pb2.ActionKind)]


@pytest.mark.parametrize(("domain", "proto"), MIRRORS, ids=["FailureKind", "ActionKind"])
def test_every_domain_member_has_a_proto_value_and_back(domain: type[enum.Enum], proto: object) -> None:
    prefix = proto_prefix(proto)  # type: ignore[arg-type]
    values = proto.keys()  # type: ignore[attr-defined]
    proto_names = {n.removeprefix(prefix) for n in values} - {"UNSPECIFIED"}
    domain_names = {m.name for m in domain}
    assert domain_names - proto_names == set(), f"{domain.__name__} members with no {prefix}* value in agent.proto"
    assert proto_names - domain_names == set(), f"agent.proto values {prefix}* with no {domain.__name__} member"
    for member in domain:
        assert from_proto(to_proto(member, proto), proto, domain) is member  # type: ignore[arg-type]


def test_numbers_of_the_first_version_keep_their_meaning() -> None:
    """Wire compatibility: renamed values kept their numbers."""
    assert agent_pb2.ACTION_KIND_RESTART_PROCESSES == 1
    assert agent_pb2.ACTION_KIND_REMOVE_NODE == 2  # was STOP_NODE
    assert agent_pb2.FAILURE_KIND_USER_CODE == 2  # was USER_CODE_ERROR
    assert agent_pb2.FAILURE_KIND_HOST_OOM == 3  # was OOM
    assert agent_pb2.FAILURE_KIND_HARDWARE == 4
    assert agent_pb2.FAILURE_KIND_COMMUNICATION == 5  # was NETWORK
    assert agent_pb2.FAILURE_KIND_HANG == 6
    assert agent_pb2.FAILURE_KIND_UNKNOWN == 7


def test_unspecified_and_unknown_numbers_are_refused_with_a_reason() -> None:
    with pytest.raises(WireEnumError, match="must be set"):
        from_proto(0, agent_pb2.FailureKind, FailureKind)
    with pytest.raises(WireEnumError, match="not a FailureKind"):
        from_proto(1, agent_pb2.FailureKind, FailureKind)  # reserved: the old PROCESS_CRASH
    with pytest.raises(WireEnumError, match="not a ActionKind"):
        from_proto(999, agent_pb2.ActionKind, ActionKind)


def test_a_member_without_a_proto_value_is_refused() -> None:
    class Stray(enum.Enum):
        NOT_MIRRORED = "x"

    with pytest.raises(WireEnumError, match="no proto value FAILURE_KIND_NOT_MIRRORED"):
        to_proto(Stray.NOT_MIRRORED, agent_pb2.FailureKind)
