"""Packages whose public names are imported on first use.

A package's ``__init__`` that imports all of its modules makes every importer pay for all of
them: ``from dlrover.common import Clock`` would load gRPC and protobuf, and a restarted training
process importing the flash checkpoint library would wait for them before restoring its state.
`lazy_exports` gives such a package a module ``__getattr__`` (PEP 562) that imports a name's
module when the name is first read, and caches the value on the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


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
