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
if importlib.util.find_spec("kubernetes") is None or importlib.util.find_spec("yaml") is None:
    collect_ignore = [
        "test_example_job.py",
        "test_manifests.py",
        "test_operator_contract.py",
        "test_operator_e2e.py",
        "test_operator_kube.py",
        "test_schema.py",
    ]
