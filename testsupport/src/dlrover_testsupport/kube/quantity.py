"""Kubernetes resource quantities ("500m", "4Gi", "1e3") as exact decimals, and a pod's requests."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["QuantityError", "parse_quantity", "pod_requests"]

_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would not accept."""


def parse_quantity(value: object) -> Decimal:
    """The value of a quantity ("500m" is 0.5, "1Gi" is 1073741824).

    Raises:
        QuantityError: `value` is not a quantity.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a resource quantity")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a resource quantity")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        raise QuantityError(f"{value!r} is not a resource quantity") from None


def _container_resources(container: Mapping[str, Any], kind: str) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    limits = {k: parse_quantity(v) for k, v in (resources.get("limits") or {}).items()}
    if kind == "limits":
        return limits
    requests = {k: parse_quantity(v) for k, v in (resources.get("requests") or {}).items()}
    # The API server defaults a missing request to the limit; this test server does no defaulting.
    return {**limits, **requests}


def _pod_total(pod: Mapping[str, Any], kind: str) -> dict[str, Decimal]:
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_resources(container, kind).items():
            total[name] = total.get(name, Decimal(0)) + amount
    # Init containers run one at a time before the others: the pod needs the largest of them.
    for container in spec.get("initContainers") or []:
        for name, amount in _container_resources(container, kind).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the scheduler reserves for `pod`: its containers' requests (a missing one: the limit).

    Raises:
        QuantityError: a request or limit is not a quantity.
    """
    return _pod_total(pod, "requests")
