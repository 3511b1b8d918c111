"""The set of rules a classifier uses, extended by third parties through entry points.

A plugin distribution declares, in its ``pyproject.toml``::

    [project.entry-points."dlrover.diagnosis.rules"]
    my-rules = "my_pkg.rules:RULES"

The target is a rule object, an iterable of rules, or a zero-argument callable returning either.
`RuleRegistry.load_entry_points` loads every entry point of the group; if any is broken it raises
`RulePluginError` naming it and registers nothing, so a half-loaded rule set never classifies.

A registry is an ordinary object: build one (usually `RuleRegistry.with_builtin_rules()`), extend
it, and pass it to `classify`. There is no global registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from importlib import metadata

from dlrover.common import ConfigError
from dlrover.diagnosis.errors import RulePluginError
from dlrover.diagnosis.rules import Rule, builtin_rules, validate_rule

__all__ = ["ENTRY_POINT_GROUP", "RuleRegistry"]

ENTRY_POINT_GROUP = "dlrover.diagnosis.rules"
"""The entry-point group third-party rules are declared in."""


def _describe(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    dist_name = getattr(dist, "name", None) or "an unknown distribution"
    return f"entry point '{ep.name} = {ep.value}' of group '{ep.group}' from {dist_name}"


def _rules_from(obj: object, origin: str) -> list[Rule]:
    if isinstance(obj, Rule):
        return [validate_rule(obj, origin=origin)]
    if callable(obj):
        return _rules_from(obj(), origin)
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes):
        return [validate_rule(item, origin=origin) for item in obj]
    raise ConfigError(f"{obj!r} is neither a rule, an iterable of rules nor a callable returning them")


class RuleRegistry:
    """An ordered set of rules with unique names.

    Args:
        rules: the initial rules.

    Raises:
        ConfigError: if a rule is malformed or two rules share a name.
    """

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules: dict[str, Rule] = {}
        self.register_all(rules)

    @classmethod
    def with_builtin_rules(cls) -> RuleRegistry:
        """A new registry holding DLRover's built-in rules."""
        return cls(builtin_rules())

    def register(self, rule: Rule) -> None:
        """Add one rule.

        Raises:
            ConfigError: if it is malformed or its name is taken; the registry is unchanged.
        """
        self.register_all([rule])

    def register_all(self, rules: Iterable[Rule]) -> None:
        """Add several rules, all or none.

        Raises:
            ConfigError: if any is malformed or any name is taken; the registry is unchanged.
        """
        new: dict[str, Rule] = {}
        for rule in rules:
            checked = validate_rule(rule)
            if checked.name in self._rules or checked.name in new:
                raise ConfigError(f"a rule named {checked.name!r} is already registered")
            new[checked.name] = checked
        self._rules.update(new)

    def unregister(self, name: str) -> Rule:
        """Remove a rule by name (to replace a built-in one) and return it.

        Raises:
            KeyError: if no rule has that name.
        """
        if name not in self._rules:
            raise KeyError(f"no rule named {name!r}; registered: {sorted(self._rules)}")
        return self._rules.pop(name)

    def load_entry_points(
        self,
        group: str = ENTRY_POINT_GROUP,
        *,
        entry_points: Iterable[metadata.EntryPoint] | None = None,
    ) -> tuple[str, ...]:
        """Load and register every rule declared in an entry-point group.

        Args:
            group: the entry-point group.
            entry_points: the entry points to load instead of those installed (for embedding
                applications that discover plugins themselves).

        Returns:
            The names of the rules added, in load order.

        Raises:
            RulePluginError: if an entry point fails to import, returns something that is not a
                rule, or clashes with a registered name. Nothing is registered in that case.
        """
        eps = list(metadata.entry_points(group=group) if entry_points is None else entry_points)
        loaded: list[Rule] = []
        for ep in sorted(eps, key=lambda e: (e.name, e.value)):
            origin = _describe(ep)
            try:
                target = ep.load()
            except Exception as exc:
                raise RulePluginError(f"could not import {origin}: {type(exc).__name__}: {exc}") from exc
            try:
                loaded.extend(_rules_from(target, origin))
            except Exception as exc:
                raise RulePluginError(f"{origin} is not a valid rule plugin: {exc}") from exc
        try:
            self.register_all(loaded)
        except ConfigError as exc:
            raise RulePluginError(f"rule plugins of group '{group}' clash: {exc}") from exc
        return tuple(rule.name for rule in loaded)

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules in registration order."""
        return tuple(self._rules.values())

    def names(self) -> tuple[str, ...]:
        """The rule names in registration order."""
        return tuple(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(tuple(self._rules.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._rules
