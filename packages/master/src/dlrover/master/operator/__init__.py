"""The ElasticJob operator (`dlrover-operator`): one master per ElasticJob on Kubernetes.

`schema` holds the CRD (one source of truth for deploy/kubernetes/crd.yaml and the operator's own
validation), `spec` checks a job's spec, `objects` builds what the operator creates, `reconcile` is
the pure decision, `controller` the watch loop that feeds it and carries out its writes, and `cli`
the console script. The official `kubernetes` client (the `k8s` extra) is imported lazily.
"""

from dlrover.master.operator.objects import MASTER_ROLE_RULES, MasterSettings, RoleRule
from dlrover.master.operator.reconcile import (
    APPLIED_SPEC_STATUS,
    MASTER_EXIT_RETRY,
    Condition,
    CreateObject,
    DeleteObject,
    Observed,
    ReconcileSettings,
    Reconciliation,
    ResizeJob,
    UpdateObject,
    Write,
    reconcile,
)
from dlrover.master.operator.schema import crd_manifest, job_schema, schema_errors
from dlrover.master.operator.spec import JobSpec, SpecCheck, check_spec

__all__ = [
    "APPLIED_SPEC_STATUS",
    "MASTER_EXIT_RETRY",
    "MASTER_ROLE_RULES",
    "Condition",
    "CreateObject",
    "DeleteObject",
    "JobSpec",
    "MasterSettings",
    "Observed",
    "ReconcileSettings",
    "Reconciliation",
    "ResizeJob",
    "RoleRule",
    "SpecCheck",
    "UpdateObject",
    "Write",
    "check_spec",
    "crd_manifest",
    "job_schema",
    "reconcile",
    "schema_errors",
]
