"""Label and field selectors as the API server parses them from a request's query."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FieldSelector", "LabelSelector", "SelectorError", "field_value"]

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class SelectorError(ValueError):
    """A selector that does not parse (the server answers 400)."""


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _checked_key(key: str, text: str) -> str:
    if not _KEY.match(key):
        raise SelectorError(f"invalid label key {key!r} in selector {text!r}")
    return key


def _checked_values(values: list[str], text: str) -> frozenset[str]:
    for v in values:
        if not _VALUE.match(v):
            raise SelectorError(f"invalid label value {v!r} in selector {text!r}")
    return frozenset(values)


Requirement = Callable[[Mapping[str, str]], bool]


def _in(key: str, values: frozenset[str], labels: Mapping[str, str]) -> bool:
    return labels.get(key) in values


def _not_in(key: str, values: frozenset[str], labels: Mapping[str, str]) -> bool:
    return labels.get(key) not in values


def _has(key: str, labels: Mapping[str, str]) -> bool:
    return key in labels


def _lacks(key: str, labels: Mapping[str, str]) -> bool:
    return key not in labels


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`."""

    text: str
    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """Raises SelectorError for a selector a real server refuses."""
        text = text or ""
        reqs: list[Requirement] = []
        for term in _split_top_level(text):
            set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
            if set_match:
                key = _checked_key(set_match.group(1), text)
                values = _checked_values([v.strip() for v in set_match.group(3).split(",") if v.strip()], text)
                reqs.append(functools.partial(_in if set_match.group(2) == "in" else _not_in, key, values))
                continue
            op_match = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term)
            if op_match:
                key = _checked_key(op_match.group(1), text)
                value = op_match.group(3)
                _checked_values([value], text)
                # `a!=b` is `a notin (b)`: it also holds where the label is absent.
                values = frozenset([value])
                reqs.append(functools.partial(_not_in if op_match.group(2) == "!=" else _in, key, values))
                continue
            if term.startswith("!"):
                reqs.append(functools.partial(_lacks, _checked_key(term[1:].strip(), text)))
                continue
            reqs.append(functools.partial(_has, _checked_key(term, text)))
        return cls(text, tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(req(labels) for req in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares: missing fields read as "", booleans as true/false."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


@dataclasses.dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector: comma-separated `field=value`, `field==value`, `field!=value`."""

    text: str
    terms: tuple[tuple[str, bool, str], ...]  # (field, equal, value)

    @classmethod
    def parse(cls, text: str | None, allowed: Callable[[str], bool]) -> FieldSelector:
        """Raises SelectorError for a malformed term or a field `allowed` refuses."""
        text = text or ""
        terms = []
        for term in (t.strip() for t in text.split(",") if t.strip()):
            match = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", term)
            if not match:
                raise SelectorError(f"invalid field selector term {term!r}")
            field = match.group(1).strip()
            if not allowed(field):
                raise SelectorError(f'field label not supported: "{field}"')
            terms.append((field, match.group(2) != "!=", match.group(3).strip()))
        return cls(text, tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, f) == v) == equal for f, equal, v in self.terms)
