from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from dlrover_testsupport.kube.fixtures import kube_api, kube_cluster  # noqa: F401 (fixtures)

# The shared builders of these tests (ej_builders.py) are imported by name.
sys.path.insert(0, str(Path(__file__).parent))

# The suites that talk to an API server need the `k8s` extra (the official client, PyYAML): a dlrover-master
# installed without it (`nox -s isolation`) runs only the pure reconcile tests; `nox -s tests-kubernetes`
# runs them all.
_PURE_SUITES = {"test_reconcile.py", "test_reconcile_stateful.py"}
"""The suites that need neither the client nor PyYAML; a new suite is left out without them unless named here."""
if importlib.util.find_spec("kubernetes") is None or importlib.util.find_spec("yaml") is None:
    collect_ignore = sorted(p.name for p in Path(__file__).parent.glob("test_*.py") if p.name not in _PURE_SUITES)
