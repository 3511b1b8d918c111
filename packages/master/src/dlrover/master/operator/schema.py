"""The ElasticJob CustomResourceDefinition: its OpenAPI v3 schema and a validator for it.

One source of truth: `crd_manifest()` is what `dlrover-operator crd` prints and what
deploy/kubernetes/crd.yaml holds (a test compares them), and `schema_errors` checks objects
against the very same schema. The operator checks every ElasticJob with it before acting, so a
spec the API server would have refused (or a server that does not validate, like the tests' one)
never reaches a pod.

The validator implements the subset of OpenAPI v3 / structural schemas the CRD uses: `type`,
`properties` (unknown fields are errors, as `kubectl apply --validate=strict` reports them, unless
`x-kubernetes-preserve-unknown-fields`), `additionalProperties`, `required`, `enum`, `minimum`,
`maximum`, `minLength`, `maxLength`, `pattern`, `minItems`, `maxItems`, `items`, `minProperties`,
`oneOf`, `anyOf`, `x-kubernetes-int-or-string`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dlrover.master.kube.names import (
    CRD_GROUP,
    CRD_KIND,
    CRD_NAME,
    CRD_PLURAL,
    CRD_SHORT_NAME,
    CRD_SINGULAR,
    CRD_VERSION,
)

__all__ = ["ROLES", "STATUS_SCHEMA", "SPEC_SCHEMA", "crd_manifest", "job_schema", "schema_errors"]

ROLES = ("worker", "ps", "chief", "evaluator")
"""Roles the schema accepts: `worker` alone (a PyTorch job run by dlrover-run), or `chief`, `ps`, `worker` and
optionally `evaluator` (a TensorFlow parameter-server job run by `dlrover-master ps-job`)."""

_QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i?|[mkMGTPE])?$"

_ANY_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

# A structural schema allows types inside anyOf only as exactly [{integer}, {string}] with
# x-kubernetes-int-or-string (what Kubernetes' own Quantity schema is); the pattern applies to the
# string form from beside it (an integer has no pattern to fail).
_QUANTITY: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": _QUANTITY_PATTERN,
}

_VOLUME_SOURCE: dict[str, Any] = {
    "type": "object",
    "description": "a Volume source without its name, e.g. {persistentVolumeClaim: {claimName: x}}",
    "minProperties": 1,
    "x-kubernetes-preserve-unknown-fields": True,
}


def _seconds(description: str, minimum: float = 0) -> dict[str, Any]:
    return {"type": "number", "minimum": minimum, "description": description}


_POD_TEMPLATE: dict[str, Any] = {
    "type": "object",
    "description": "a PodTemplateSpec; the container named `main` (else the first) runs dlrover-run (a worker job), "
    "the training program (a parameter-server job's chief and evaluator), or, without a command, TensorFlow's server "
    "(its ps and worker)",
    "properties": {"metadata": _ANY_OBJECT, "spec": _ANY_OBJECT},
}

_REPLICA_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["template"],
    "properties": {
        "template": _POD_TEMPLATE,
        "minReplicas": {"type": "integer", "minimum": 1, "description": "absent: planned by the master"},
        "maxReplicas": {"type": "integer", "minimum": 1, "description": "absent: planned by the master"},
        "spareReplicas": {
            "type": "integer",
            "minimum": 0,
            "description": "warm spare pods that take a lost node's rank over from memory (default 0)",
        },
        "resources": {
            "type": "object",
            "description": "per node, e.g. {cpu: '2', memory: 4Gi, nvidia.com/gpu: '1'}; absent: planned by the master",
            "additionalProperties": _QUANTITY,
        },
    },
}

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["replicaSpecs"],
    "properties": {
        "suspend": {"type": "boolean", "description": "true: the master and the workers are stopped; false resumes"},
        "replicaSpecs": {
            "type": "object",
            "required": ["worker"],
            "description": "by role: worker alone (dlrover-run), or chief, ps, worker and optionally evaluator (a "
            "TensorFlow parameter-server job)",
            "properties": {role: _REPLICA_SPEC for role in ROLES},
        },
        "rendezvous": {
            "type": "object",
            "properties": {
                "minNodes": {"type": "integer", "minimum": 1},
                "maxNodes": {"type": "integer", "minimum": 1},
                "joinTimeoutSeconds": _seconds("a node waiting this long for a round is told it timed out", 1),
                "lastCallSeconds": _seconds("after the last join, wait this long for more nodes"),
                "plannedWaitSeconds": _seconds(
                    "a planned round (a resize let nodes go, a spare takes a rank) waits this long for its slow nodes"
                ),
            },
        },
        "timeouts": {
            "type": "object",
            "properties": {
                "nodePendingSeconds": _seconds("a node not running after this long is announced; 0: never"),
                "heartbeatSeconds": _seconds("a node silent this long is taken for lost", 1),
                "nodeStartSeconds": _seconds("a node not registered this long after its start failed; 0: never"),
            },
        },
        "checkpoint": {
            "type": "object",
            "description": "where checkpoints persist: a volume (mounted at /checkpoints in workers) or an object "
            "store",
            "properties": {
                "volume": _VOLUME_SOURCE,
                "objectStore": {
                    "type": "object",
                    "required": ["uri"],
                    "properties": {
                        "uri": {"type": "string", "pattern": r"^[a-z][a-z0-9+.-]*://.+"},
                        "secretName": {"type": "string", "minLength": 1},
                    },
                },
            },
            "oneOf": [{"required": ["volume"]}, {"required": ["objectStore"]}],
        },
        "master": {
            "type": "object",
            "properties": {
                "image": {"type": "string", "minLength": 1, "description": "default: the operator's own image"},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "stateVolume": _VOLUME_SOURCE,
                "tls": {
                    "type": "object",
                    "required": ["secretName"],
                    "properties": {
                        "secretName": {"type": "string", "minLength": 1},
                        "caKey": {
                            "type": "string",
                            "minLength": 1,
                            "description": "the key of the Secret that verifies the master for workers: tls.crt "
                            "(default; a self-signed certificate) or ca.crt (a CA-signed one)",
                        },
                    },
                },
                "resources": {
                    "type": "object",
                    "properties": {
                        "limits": {"type": "object", "additionalProperties": _QUANTITY},
                        "requests": {"type": "object", "additionalProperties": _QUANTITY},
                    },
                },
            },
        },
    },
}
"""What a user writes: `spec` of an ElasticJob."""

_CONDITION: dict[str, Any] = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "lastTransitionTime": {"type": "string"},
        "observedGeneration": {"type": "integer"},
    },
}

_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "phase": {"type": "string", "enum": ["Pending", "Running", "Succeeded", "Failed", "Suspended"]},
        "conditions": {"type": "array", "items": _CONDITION},
        "nodes": {
            "type": "object",
            "properties": {k: _COUNT for k in ("pending", "running", "succeeded", "failed")},
        },
        "restarts": _COUNT,
        "relaunches": _COUNT,
        "goodput": {"type": "number", "minimum": 0, "maximum": 1},
        "step": {"type": "integer"},
        "targetNodes": _COUNT,
        "minNodes": _COUNT,
        "maxNodes": _COUNT,
        "observedGeneration": {"type": "integer"},
        "message": {"type": "string"},
        "masterRestarts": _COUNT,
        "countedMaster": {
            "type": "string",
            "description": "the uid of the last master pod whose end masterRestarts counted, or that the operator "
            "deleted itself (suspend): a lagging view that still shows it counts nothing again",
        },
        "masterAddress": {"type": "string"},
        "appliedSpec": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "description": "the spec in force: the one the running master was started with, with the node counts "
            "carried out since; a master that dies while an edit is refused is replaced from it",
        },
    },
}
"""What the operator writes: `status` of an ElasticJob (a real API server prunes what is not here)."""


def job_schema() -> dict[str, Any]:
    """The whole object's schema (the CRD's `openAPIV3Schema`)."""
    return {
        "type": "object",
        "description": "An elastic training job run by a DLRover master.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": SPEC_SCHEMA,
            "status": STATUS_SCHEMA,
        },
    }


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition of ElasticJob (apiextensions.k8s.io/v1)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "dlrover"}},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": CRD_PLURAL,
                "singular": CRD_SINGULAR,
                "kind": CRD_KIND,
                "listKind": f"{CRD_KIND}List",
                "shortNames": [CRD_SHORT_NAME],
            },
            "versions": [
                {
                    "name": CRD_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": job_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Running", "type": "integer", "jsonPath": ".status.nodes.running"},
                        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
                        {"name": "Goodput", "type": "number", "format": "float", "jsonPath": ".status.goodput"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {
                            "name": "Master-Restarts",
                            "type": "integer",
                            "priority": 1,
                            "jsonPath": ".status.masterRestarts",
                        },
                        {"name": "Message", "type": "string", "priority": 1, "jsonPath": ".status.message"},
                    ],
                }
            ],
        },
    }


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def _type_ok(expected: str, value: object) -> bool:
    if isinstance(value, bool) and expected != "boolean":
        return False
    if expected == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[expected])


def schema_errors(schema: Mapping[str, Any], value: object, path: str = "") -> list[str]:
    """Every way `value` breaks `schema`, each naming the field (`spec.master.port: ...`); [] when valid."""
    where = path or "<root>"
    if schema.get("x-kubernetes-int-or-string") and not isinstance(value, bool) and isinstance(value, int | str):
        pass
    elif "type" in schema and not _type_ok(schema["type"], value):
        return [f"{where}: must be of type {schema['type']}, got {type(value).__name__} {value!r:.80}"]
    errors = _combinator_errors(schema, value, path, where)
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: must be one of {', '.join(map(str, schema['enum']))}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        errors.extend(_number_errors(schema, value, where))
    if isinstance(value, str):
        errors.extend(_string_errors(schema, value, where))
    if isinstance(value, list):
        errors.extend(_array_errors(schema, value, path, where))
    if isinstance(value, dict):
        errors.extend(_object_errors(schema, value, path, where))
    return errors


def _combinator_errors(schema: Mapping[str, Any], value: object, path: str, where: str) -> list[str]:
    errors = []
    for key in ("anyOf", "oneOf"):
        if key in schema:
            matching = sum(not schema_errors(option, value, path) for option in schema[key])
            if key == "anyOf" and matching == 0:
                errors.append(f"{where}: {value!r:.80} matches none of the allowed forms")
            if key == "oneOf" and matching != 1:
                errors.append(f"{where}: must match exactly one of {_forms(schema[key])}, matches {matching}")
    return errors


def _number_errors(schema: Mapping[str, Any], value: float, where: str) -> list[str]:
    errors = []
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: must be at least {schema['minimum']}, got {value}")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{where}: must be at most {schema['maximum']}, got {value}")
    return errors


def _forms(options: list[Mapping[str, Any]]) -> str:
    return " or ".join("{" + ", ".join(o.get("required", [])) + "}" for o in options)


def _string_errors(schema: Mapping[str, Any], value: str, where: str) -> list[str]:
    errors = []
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{where}: must be at least {schema['minLength']} characters long")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{where}: must be at most {schema['maxLength']} characters long")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r:.80} does not match {schema['pattern']}")
    return errors


def _array_errors(schema: Mapping[str, Any], value: list[Any], path: str, where: str) -> list[str]:
    errors = []
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{where}: must hold at least {schema['minItems']} item(s)")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{where}: must hold at most {schema['maxItems']} item(s)")
    if "items" in schema:
        for i, item in enumerate(value):
            errors.extend(schema_errors(schema["items"], item, f"{path}[{i}]"))
    return errors


def _object_errors(schema: Mapping[str, Any], value: dict[str, Any], path: str, where: str) -> list[str]:
    errors = [f"{where}: missing required field {name!r}" for name in schema.get("required", ()) if name not in value]
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(f"{where}: must have at least {schema['minProperties']} field(s)")
    properties: Mapping[str, Any] = schema.get("properties", {})
    additional = schema.get("additionalProperties")
    for name, item in value.items():
        child = f"{path}.{name}" if path else name
        if name in properties:
            errors.extend(schema_errors(properties[name], item, child))
        elif isinstance(additional, Mapping):
            errors.extend(schema_errors(additional, item, child))
        elif not schema.get("x-kubernetes-preserve-unknown-fields") and (properties or additional is False):
            errors.append(f"{child}: unknown field")
    return errors
