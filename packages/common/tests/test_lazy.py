"""Lazily imported package names (dlrover.common.lazy) and what importing dlrover.common costs."""

from __future__ import annotations

import sys
import types

import pytest

import dlrover.common
from dlrover.common.lazy import lazy_export_problems, lazy_exports, modules_loaded_by

pytestmark = pytest.mark.timeout(60)


def test_a_name_is_imported_on_first_read_and_then_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    package = types.ModuleType("fake_lazy_package")
    monkeypatch.setitem(sys.modules, "fake_lazy_package", package)
    getattr_, dir_ = lazy_exports("fake_lazy_package", {"dumps": "json"})
    package.__getattr__ = getattr_  # type: ignore[attr-defined]

    import json

    assert package.dumps is json.dumps  # type: ignore[attr-defined]
    assert package.__dict__["dumps"] is json.dumps  # cached: the module __getattr__ is not called again
    assert dir_() == ["dumps"]


def test_an_unknown_name_raises_attribute_error_naming_the_package() -> None:
    getattr_, _ = lazy_exports("fake_lazy_package", {})
    with pytest.raises(AttributeError, match="'fake_lazy_package' has no attribute 'nope'"):
        getattr_("nope")


def test_every_public_name_of_dlrover_common_is_its_modules_own() -> None:
    assert lazy_export_problems(dlrover.common, dlrover.common._EXPORTS) == []


def test_the_clock_and_validators_do_not_import_grpc_or_protobuf() -> None:
    # The flash checkpoint library uses these in training processes, which restart on a failure
    # and must not wait for gRPC and protobuf (over 0.1 s) before restoring their state.
    assert modules_loaded_by("from dlrover.common import Clock, ConfigError, SystemClock, positive_int") == []


def test_modules_loaded_by_sees_what_a_statement_imports() -> None:
    assert modules_loaded_by("import dlrover.common.server") != []  # the gRPC server module loads grpc
    assert modules_loaded_by("pass", packages=("csv",)) == []
    assert modules_loaded_by("import csv", packages=("csv",)) == ["csv"]
