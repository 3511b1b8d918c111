"""The ElasticJob CRD: the YAML in deploy/ is the schema the operator validates with, and it
accepts good specs and refuses bad ones naming the field (the test API server validates nothing,
so the operator's own check is what guards it there)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from ej_builders import elastic_job

from dlrover.master.operator import check_spec, crd_manifest, job_schema, schema_errors
from dlrover.master.operator.cli import crd_yaml, main

DEPLOY = Path(__file__).resolve().parents[4] / "deploy" / "kubernetes"


def test_the_crd_file_is_the_one_the_code_generates() -> None:
    text = (DEPLOY / "crd.yaml").read_text()
    assert text == crd_yaml(), "regenerate it: dlrover-operator crd > deploy/kubernetes/crd.yaml"
    crd = yaml.safe_load(text)
    assert crd == crd_manifest()
    assert crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] == job_schema()


def test_the_crd_names_status_subresource_and_printer_columns() -> None:
    crd = crd_manifest()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "elasticjobs.elastic.dlrover.io"
    assert spec["group"] == "elastic.dlrover.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "plural": "elasticjobs",
        "singular": "elasticjob",
        "kind": "ElasticJob",
        "listKind": "ElasticJobList",
        "shortNames": ["ej"],
    }
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Running"] == ".status.nodes.running"
    assert columns["Restarts"] == ".status.restarts"
    assert columns["Goodput"] == ".status.goodput"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_the_crd_command_prints_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == (DEPLOY / "crd.yaml").read_text()


def test_the_example_job_is_valid() -> None:
    example = yaml.safe_load((DEPLOY / "example-elasticjob.yaml").read_text())
    example["metadata"].update(namespace="default", uid="u")
    check = check_spec(example)
    assert check.errors == ()
    assert check.spec is not None
    assert check.spec.claims == {
        "spec.checkpoint.volume": "gpt-checkpoints",
        "spec.master.stateVolume": "gpt-master-state",
    }


def _full() -> dict[str, Any]:
    return elastic_job(
        suspend=False,
        rendezvous={"minNodes": 1, "maxNodes": 2, "joinTimeoutSeconds": 60, "lastCallSeconds": 0},
        timeouts={"nodePendingSeconds": 0, "heartbeatSeconds": 30, "nodeStartSeconds": 120},
        checkpoint={"objectStore": {"uri": "s3://bucket/prefix", "secretName": "creds"}},
        master={
            "image": "x:1",
            "port": 50001,
            "stateVolume": {"persistentVolumeClaim": {"claimName": "st"}},
            "tls": {"secretName": "tls"},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": 2048}},
        },
    )


def test_a_full_spec_is_accepted() -> None:
    job = _full()
    job["spec"]["replicaSpecs"]["worker"]["resources"] = {"cpu": 2, "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert schema_errors(job_schema(), job) == []
    assert check_spec(job).errors == ()


def _set(job: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(job)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.replicaSpecs", _DELETE, "spec: missing required field 'replicaSpecs'"),
        ("spec.replicaSpecs.worker.template", _DELETE, "spec.replicaSpecs.worker: missing required field 'template'"),
        ("spec.replicaSpecs.worker.minReplicas", 0, "spec.replicaSpecs.worker.minReplicas: must be at least 1"),
        ("spec.replicaSpecs.worker.maxReplicas", "4", "spec.replicaSpecs.worker.maxReplicas: must be of type integer"),
        ("spec.replicaSpecs.launcher", {"template": {}}, "spec.replicaSpecs.launcher: unknown field"),
        ("spec.replicaSpecs.worker.resources", {"memory": "lots"}, "spec.replicaSpecs.worker.resources.memory"),
        ("spec.suspend", "yes", "spec.suspend: must be of type boolean"),
        ("spec.rendezvous.lastCallSeconds", -1, "spec.rendezvous.lastCallSeconds: must be at least 0"),
        ("spec.rendezvous.joinTimeout", 5, "spec.rendezvous.joinTimeout: unknown field"),
        ("spec.timeouts.heartbeatSeconds", 0, "spec.timeouts.heartbeatSeconds: must be at least 1"),
        ("spec.checkpoint", {}, "spec.checkpoint: must match exactly one of {volume} or {objectStore}, matches 0"),
        (
            "spec.checkpoint.volume",
            {"emptyDir": {}},
            "spec.checkpoint: must match exactly one of {volume} or {objectStore}, matches 2",
        ),
        ("spec.checkpoint.objectStore.uri", "bucket/prefix", "spec.checkpoint.objectStore.uri"),
        ("spec.master.port", 0, "spec.master.port: must be at least 1"),
        ("spec.master.stateVolume", {}, "spec.master.stateVolume: must have at least 1 field(s)"),
        ("spec.master.tls", {}, "spec.master.tls: missing required field 'secretName'"),
        ("spec.master.resources.limits", {"cpu": True}, "spec.master.resources.limits.cpu"),
        ("spec.master.replicas", 2, "spec.master.replicas: unknown field"),
    ],
)
def test_the_schema_refuses_bad_specs_naming_the_field(path: str, value: Any, message: str) -> None:
    job = _set(_full(), path, value)
    errors = schema_errors(job_schema(), job)
    assert any(message in e for e in errors), errors
    assert check_spec(job).spec is None


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.replicaSpecs.worker.resources", {"memory": "4GB"}, "spec.replicaSpecs.worker.resources.memory"),
        ("spec.replicaSpecs.worker.resources", {"cpu": "1.5x"}, "spec.replicaSpecs.worker.resources.cpu"),
        ("spec.replicaSpecs.worker.resources", {"ephemeral-storage": "1Gi"}, "not a resource the master plans"),
        (
            "spec.replicaSpecs.ps",
            {"template": {"spec": {"containers": [{"name": "a"}]}}},
            "spec.replicaSpecs.chief: a parameter-server job needs chief, ps and worker",
        ),
        ("spec.timeouts.heartbeatSeconds", 2, "spec.timeouts.heartbeatSeconds (2) must be at least 3"),
    ],
)
def test_rules_beyond_the_schema_name_the_field(path: str, value: Any, message: str) -> None:
    check = check_spec(_set(_full(), path, value))
    assert check.spec is None
    assert any(message in e for e in check.errors), check.errors


def test_the_validator_knows_int_or_string_and_anyof() -> None:
    quantity = {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[0-9]+Mi$"}],
    }
    assert schema_errors(quantity, 5) == []
    assert schema_errors(quantity, "5Mi") == []
    assert schema_errors(quantity, "5Gi") != []
    assert schema_errors(quantity, 1.5) != []
    assert schema_errors({"type": "integer"}, True) != []
    assert schema_errors({"type": "number"}, 2) == []
    assert schema_errors({"type": "array", "items": {"type": "string"}, "minItems": 1}, []) == [
        "<root>: must hold at least 1 item(s)"
    ]


def _structural_violations(node: Any, path: str = "") -> list[str]:
    """What a real API server refuses in a CRD's schema (the structural rules the test server does not
    check): inside anyOf/oneOf/allOf/not no `type`, `properties`, `items` or `additionalProperties`,
    except the one int-or-string form [{type: integer}, {type: string}]."""
    out: list[str] = []
    if isinstance(node, dict):
        for combinator in ("anyOf", "oneOf", "allOf"):
            branches = node.get(combinator) or []
            int_or_string = combinator == "anyOf" and node.get("x-kubernetes-int-or-string") is True
            if int_or_string and branches == [{"type": "integer"}, {"type": "string"}]:
                continue
            for i, branch in enumerate(branches):
                for key in ("type", "properties", "items", "additionalProperties", "x-kubernetes-int-or-string"):
                    if key in branch:
                        out.append(f"{path}.{combinator}[{i}].{key}")
        for key, value in node.items():
            out.extend(_structural_violations(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_structural_violations(value, f"{path}[{i}]"))
    return out


def test_the_crd_schema_is_structural_as_a_real_api_server_requires() -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _structural_violations(schema) == []
    quantity = schema["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]["worker"]["properties"][
        "resources"
    ]["additionalProperties"]
    assert schema_errors(quantity, "4Gi") == []
    assert schema_errors(quantity, 2) == []
    assert schema_errors(quantity, "four") != []
