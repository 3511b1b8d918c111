"""The package's public names, imported lazily (workers import it and must not pay for gRPC)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_every_public_name_is_its_modules_own() -> None:
    import dlrover.launcher
    from dlrover.common.lazy import lazy_export_problems

    assert lazy_export_problems(dlrover.launcher, dlrover.launcher._EXPORTS) == []


def test_the_orphan_guard_does_not_import_grpc() -> None:
    # Every worker start goes through it, restarts included.
    from dlrover.common.lazy import modules_loaded_by

    assert modules_loaded_by("import dlrover.launcher._orphan_guard") == []
