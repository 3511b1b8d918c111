"""Lazily imported package names (dlrover.common.lazy) and what importing dlrover.common costs."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import dlrover.common
from dlrover.common.lazy import lazy_export_problems, lazy_exports

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
    code = (
        "import sys\n"
        "from dlrover.common import Clock, ConfigError, SystemClock, positive_int\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc' or m.startswith('google.protobuf')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
