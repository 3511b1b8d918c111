"""The package's public names, imported lazily (workers import it and must not pay for gRPC)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dlrover.launcher

pytestmark = pytest.mark.timeout(120)


def test_every_public_name_resolves() -> None:
    for name in dlrover.launcher.__all__:
        assert getattr(dlrover.launcher, name) is not None, name
    assert sorted(dlrover.launcher.__all__) == dir(dlrover.launcher)


def test_the_orphan_guard_does_not_import_grpc() -> None:
    # Every worker start goes through it, restarts included.
    code = (
        "import sys\n"
        "import dlrover.launcher._orphan_guard\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc' or m.startswith('google.protobuf')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
