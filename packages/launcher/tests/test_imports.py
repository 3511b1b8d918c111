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

    assert modules_loaded_by("import dlrover.common.orphan_guard") == []


_TRACE_ENV_READS = """
import json, os, sys
import torch  # a standby imports torch first; what torch reads is env_guard's torch list
reads = []
class Tracing(type(os.environ)):
    def __getitem__(self, key):
        reads.append(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        reads.append(key)
        return super().__contains__(key)
    def get(self, key, default=None):
        reads.append(key)
        return super().get(key, default)
os.environ.__class__ = Tracing
real_getenv = os.getenv
os.getenv = lambda key, default=None: (reads.append(key), real_getenv(key, default))[1]
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(set(reads))))
"""


@pytest.mark.integration
def test_the_modules_a_standby_may_prewarm_without_a_check_read_no_environment_at_import() -> None:
    # env_guard lets a script set any variable before it imports these: they must read none.
    import json
    import subprocess
    import sys

    from dlrover.launcher.env_guard import _READS_NOTHING_AT_IMPORT

    out = subprocess.run(
        [sys.executable, "-c", _TRACE_ENV_READS, *sorted(_READS_NOTHING_AT_IMPORT)],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    ).stdout
    assert json.loads(out) == []


@pytest.mark.integration
def test_what_the_prewarmable_modules_of_ours_import_with_them_is_declared() -> None:
    # A standby that prewarmed one of them had torch imported too, and the guard counts on it.
    import subprocess
    import sys

    from dlrover.launcher.env_guard import _READS_NOTHING_AT_IMPORT, also_imports

    for module in sorted(_READS_NOTHING_AT_IMPORT):
        out = subprocess.run(
            [sys.executable, "-c", f"import sys, {module}; print('torch' in sys.modules)"],
            capture_output=True,
            text=True,
            timeout=100,
            check=True,
        ).stdout.strip()
        assert out == str("torch" in also_imports(module)), module
