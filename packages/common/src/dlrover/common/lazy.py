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
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["lazy_export_problems", "lazy_exports", "modules_loaded_by"]


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
    import pkgutil  # here, not at the top: every `import dlrover.common` loads this module

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


GRPC_MODULES = ("grpc", "google.protobuf")
"""The modules a training process should not pay for before it restores (over 0.1 s to import)."""


def modules_loaded_by(statement: str, packages: Sequence[str] = GRPC_MODULES, timeout_s: float = 120.0) -> list[str]:
    """The modules of `packages` that `statement` loads in a fresh interpreter, for import-cost tests.

    Args:
        statement: Python code, e.g. ``"from dlrover.common import Clock"``.
        packages: top-level packages or dotted prefixes to report (a module or any submodule).
        timeout_s: bound on the interpreter's run.

    Raises:
        subprocess.CalledProcessError: the statement failed (its stderr is on the exception).
    """
    import subprocess  # here, not at the top: every `import dlrover.common` loads this module

    # Only sys is imported around the statement, and it is loaded in every interpreter anyway.
    code = f"import sys\n{statement}\nprint('MODULES', *sorted(sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True)
    loaded = next(line for line in reversed(out.stdout.splitlines()) if line.startswith("MODULES")).split()[1:]
    return [m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages)]
