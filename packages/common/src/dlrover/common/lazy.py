"""Packages whose public names are imported on first use.

A package's ``__init__`` that imports all of its modules makes every importer pay for all of
them: ``from dlrover.common import Clock`` would load gRPC and protobuf, and a restarted training
process importing the flash checkpoint library would wait for them before restoring its state.
`lazy_exports` gives such a package a module ``__getattr__`` (PEP 562) that imports a name's
module when the name is first read, and caches the value on the package.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["lazy_export_problems", "lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package that imports its names lazily.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module that defines it.

    Returns:
        ``(__getattr__, __dir__)``, to be assigned to those names in the package's ``__init__``.
    """
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(table)

    return __getattr__, __dir__


def lazy_export_problems(package: ModuleType, exports: Mapping[str, str]) -> list[str]:
    """What is wrong with a lazily exporting package, for its tests; [] when nothing.

    Imports every submodule first: a submodule named like an export would replace the export on
    the package once imported (the import system sets it as an attribute), which only shows after.

    Args:
        package: the package.
        exports: its name -> module table (the one given to `lazy_exports`).

    Returns:
        One sentence per problem: ``__all__`` differs from the table, or a name does not resolve to
        the object its module defines.
    """
    problems = []
    if sorted(getattr(package, "__all__", ())) != sorted(exports):
        problems.append(f"{package.__name__}.__all__ differs from its lazy exports")
    for info in pkgutil.iter_modules(package.__path__):
        try:
            importlib.import_module(f"{package.__name__}.{info.name}")
        except ModuleNotFoundError as e:
            # An optional dependency that is not installed (e.g. transformers for an adapter):
            # a submodule that cannot be imported cannot replace an export either.
            if e.name is None or e.name.startswith(package.__name__):
                raise
    for name, module in exports.items():
        if getattr(package, name) is not getattr(importlib.import_module(module), name):
            problems.append(f"{package.__name__}.{name} is not {module}.{name}")
    return problems
