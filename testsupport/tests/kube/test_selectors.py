"""Label and field selectors, parsed as the API server parses a request's query."""

from __future__ import annotations

import pytest
from dlrover_testsupport.kube import BUILTIN_RESOURCES, FieldSelector, LabelSelector, SelectorError

pytestmark = pytest.mark.timeout(30)

PODS = next(rt for rt in BUILTIN_RESOURCES if rt.plural == "pods")


def _obj(labels: dict[str, str], **fields: object) -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels}, **fields}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("app=x", {"app": "x"}, True),
        ("app==x", {"app": "y"}, False),
        ("app!=x", {}, True),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("role in (worker, ps),app", {"role": "ps", "app": "a"}, True),
        ("role in (worker,ps)", {"role": "chief"}, False),
        ("role notin (worker)", {}, True),
        ("dlrover.org/job=j1,role=worker", {"dlrover.org/job": "j1", "role": "worker"}, True),
    ],
)
def test_label_selectors_match_as_on_a_real_server(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector.parse(selector).matches(_obj(labels)) is expected


@pytest.mark.parametrize("selector", ["app=x y", "a b c", "=x", "app in (a b)"])
def test_a_malformed_label_selector_is_refused(selector: str) -> None:
    with pytest.raises(SelectorError):
        LabelSelector.parse(selector)


def test_field_selectors_read_fields_and_refuse_unsupported_ones() -> None:
    pod = _obj({}, spec={"nodeName": "n1"}, status={"phase": "Running"})
    unscheduled = _obj({}, spec={}, status={"phase": "Pending"})
    assert FieldSelector.parse("spec.nodeName=n1,status.phase!=Failed", PODS.field_selectable).matches(pod)
    assert not FieldSelector.parse("status.phase==Pending", PODS.field_selectable).matches(pod)
    assert FieldSelector.parse("spec.nodeName=", PODS.field_selectable).matches(unscheduled)
    assert FieldSelector.parse("metadata.name=p,metadata.namespace=ns", PODS.field_selectable).matches(pod)
    with pytest.raises(SelectorError, match="field label not supported"):
        FieldSelector.parse("spec.containers=x", PODS.field_selectable)
    with pytest.raises(SelectorError):
        FieldSelector.parse("phase", PODS.field_selectable)
