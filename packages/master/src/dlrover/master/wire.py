"""The protocol's enums as mirrors of the domain's: one conversion, by name, for every pair.

A proto enum ``FailureKind`` mirrors a domain enum member ``X`` as ``FAILURE_KIND_X`` (the proto
enum's name in upper snake case, then the member's name). There is no table to keep in step: a
kind added to `dlrover.diagnosis.FailureKind` needs only its proto value (the mirror test in
packages/master/tests/test_proto_mirror.py fails until it has one).
"""

from __future__ import annotations

import enum
import re
from typing import Protocol, TypeVar

from dlrover.common import DLRoverError

__all__ = ["ProtoEnum", "WireEnumError", "from_proto", "proto_name", "proto_prefix", "to_proto"]

E = TypeVar("E", bound=enum.Enum)


class WireEnumError(DLRoverError):
    """A number or member with no counterpart on the other side of the wire."""


class _Descriptor(Protocol):
    @property
    def name(self) -> str: ...


class ProtoEnum(Protocol):
    """What generated code offers for a proto enum (its ``EnumTypeWrapper``)."""

    @property
    def DESCRIPTOR(self) -> _Descriptor:
        """The enum's descriptor."""
        ...

    def Name(self, number: int) -> str:
        """The value's name; raises ValueError for an unknown number."""
        ...

    def Value(self, name: str) -> int:
        """The name's number; raises ValueError for an unknown name."""
        ...


def proto_prefix(proto_enum: ProtoEnum) -> str:
    """``FAILURE_KIND_`` for the proto enum ``FailureKind``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", proto_enum.DESCRIPTOR.name).upper() + "_"


def proto_name(member: enum.Enum, proto_enum: ProtoEnum) -> str:
    """The name of the proto value mirroring `member` (``FAILURE_KIND_HANG``): what a generated
    message's constructor takes for an enum field.

    Raises:
        WireEnumError: the proto enum has no value of that name.
    """
    name = proto_prefix(proto_enum) + member.name
    try:
        proto_enum.Value(name)
    except ValueError:
        raise WireEnumError(f"{type(member).__name__}.{member.name} has no proto value {name}") from None
    return name


def to_proto(member: enum.Enum, proto_enum: ProtoEnum) -> int:
    """The proto number mirroring `member`.

    Raises:
        WireEnumError: the proto enum has no value of that name.
    """
    return proto_enum.Value(proto_name(member, proto_enum))


def from_proto(number: int, proto_enum: ProtoEnum, domain: type[E]) -> E:
    """The domain member mirrored by proto `number`.

    Raises:
        WireEnumError: the number is unspecified (0), unknown, or names no member of `domain`.
    """
    what = proto_enum.DESCRIPTOR.name
    try:
        name = proto_enum.Name(number)
    except ValueError:
        raise WireEnumError(f"{number} is not a {what} this master knows") from None
    member = name.removeprefix(proto_prefix(proto_enum))
    if member == "UNSPECIFIED":
        raise WireEnumError(f"{what} must be set, got {name}")
    try:
        return domain[member]
    except KeyError:
        raise WireEnumError(f"{name} has no {domain.__name__} member {member}") from None
