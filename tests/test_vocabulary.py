"""One vocabulary for failures: the kinds, the actions and the decision belong to dlrover.diagnosis.

These tests read the source tree. They fail, naming the file, when a package outside
packages/diagnosis defines its own failure-kind or action enum (the mapping tables such a second
vocabulary needs are what issue 27 removed), or when a file outside the diagnosis package and its
proto mirror names a failure kind: adding a kind must touch only those.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.diagnosis import ActionKind, FailureKind

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
DIAGNOSIS = PACKAGES / "diagnosis"
PROTO_MIRROR = PACKAGES / "master" / "proto" / "dlrover" / "master" / "v1" / "agent.proto"
# Generated from PROTO_MIRROR by tools/gen_proto.py, never edited by hand.
GENERATED_MIRROR = {
    PACKAGES / "master" / "src" / "dlrover" / "master" / "v1" / "agent_pb2.py",
    PACKAGES / "master" / "src" / "dlrover" / "master" / "v1" / "agent_pb2.pyi",
}

_DOMAIN_MEMBERS = {m.name for m in FailureKind} | {m.name for m in ActionKind}
_SUSPECT_NAME = re.compile(
    r"^(Agent|Node|Master|Worker|Diagnosed|Reported)?(Failure|Action)(Kind|Action|Decision|Type)?$"
    r"|Failure(Kind|Action|Decision)$"
)


def _sources() -> Iterator[Path]:
    for path in sorted(PACKAGES.glob("*/src/**/*.py")):
        if not path.name.endswith("_pb2.py") and not path.name.endswith("_pb2_grpc.py"):
            yield path


def _is_enum_base(base: ast.expr) -> bool:
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return name.endswith("Enum")


def second_vocabularies(source: str) -> list[str]:
    """The enums in `source` that look like a failure-kind or action vocabulary, with why."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef) or not any(_is_enum_base(b) for b in node.bases):
            continue
        members = {
            t.id
            for stmt in node.body
            if isinstance(stmt, ast.Assign)
            for t in stmt.targets
            if isinstance(t, ast.Name) and t.id.isupper()
        }
        shared = sorted(members & _DOMAIN_MEMBERS)
        if _SUSPECT_NAME.search(node.name):
            found.append(f"enum {node.name} (line {node.lineno}) is named like a failure kind or action")
        elif len(shared) >= 2:
            found.append(f"enum {node.name} (line {node.lineno}) has members of FailureKind/ActionKind: {shared}")
    return found


def test_the_detector_finds_a_second_vocabulary() -> None:
    """The scan below would catch what issue 27 removed, and leaves unrelated enums alone."""
    assert second_vocabularies("import enum\nclass FailureAction(enum.StrEnum):\n    STOP_JOB = 's'\n")
    assert second_vocabularies("from enum import Enum\nclass AgentAction(Enum):\n    STOP_NODE = 's'\n")
    assert second_vocabularies("import enum\nclass Kinds(enum.Enum):\n    HANG = 1\n    NAN_LOSS = 2\n")
    assert not second_vocabularies("import enum\nclass EnvWriteAction(enum.Enum):\n    WARN = 1\n    IGNORE = 2\n")
    assert not second_vocabularies("import enum\nclass NodeState(enum.StrEnum):\n    RUNNING = 'r'\n")


def test_no_package_outside_diagnosis_defines_a_failure_kind_or_action_enum() -> None:
    offenders = []
    for path in _sources():
        if DIAGNOSIS in path.parents:
            continue
        for finding in second_vocabularies(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT)}: {finding}")
    assert not offenders, (
        "failure kinds and actions belong to dlrover.diagnosis (FailureKind, ActionKind); use those "
        "instead of a second enum and a mapping table:\n" + "\n".join(offenders)
    )


def _names_a_failure_kind(path: Path) -> bool:
    """Whether `path` names a member of `FailureKind` (through any alias it imports it as)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return bool(re.search(r"\bFAILURE_KIND_[A-Z]", text))
    tree = ast.parse(text)
    aliases = {"FailureKind"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            aliases |= {a.asname for a in node.names if a.name == "FailureKind" and a.asname}
    kinds = {m.name for m in FailureKind}
    return any(
        isinstance(node, ast.Attribute)
        and node.attr in kinds
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        for node in ast.walk(tree)
    )


def files_naming_failure_kinds() -> set[Path]:
    """Every source and proto file of the packages that names a failure kind."""
    candidates = [
        *PACKAGES.glob("*/src/**/*.py"),
        *PACKAGES.glob("*/src/**/*.pyi"),
        *PACKAGES.glob("*/proto/**/*.proto"),
    ]
    return {p for p in candidates if _names_a_failure_kind(p)}


def test_adding_a_failure_kind_touches_only_diagnosis_and_its_proto_mirror() -> None:
    naming = files_naming_failure_kinds()
    outside = sorted(str(p.relative_to(ROOT)) for p in naming if DIAGNOSIS not in p.parents)
    allowed = sorted(str(p.relative_to(ROOT)) for p in {PROTO_MIRROR, *GENERATED_MIRROR})
    assert set(outside) <= set(allowed), (
        "only the diagnosis package and its proto mirror may name failure kinds (adding a kind must "
        f"touch nothing else); these files name kinds too: {sorted(set(outside) - set(allowed))}"
    )
    # The scan really sees names: the kinds' home and the mirror are in the list.
    assert PROTO_MIRROR in naming
    assert DIAGNOSIS / "src" / "dlrover" / "diagnosis" / "kinds.py" in naming


LAUNCHER = PACKAGES / "launcher" / "src" / "dlrover" / "launcher"
# The launcher's own in-memory fakes of its own seams (ControlPlane, StoreHost) are exported for
# tests by the package and the module that defines them; no other launcher module imports them.
_OWN_FAKE_MODULES = {"dlrover.launcher.fake_control"}
_OWN_FAKE_EXPORTERS = {"fake_control.py", "__init__.py"}


def forbidden_imports(source: str, file_name: str) -> list[str]:
    """The imports in a launcher module of `file_name` that reach a generated proto module (of
    any package) or a fake (another package's, or the launcher's own outside its exporters)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [a.name for a in node.names], []
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if "v1" in parts or any(p.endswith(("_pb2", "_pb2_grpc")) for p in parts):
                found.append(f"line {node.lineno} imports the generated proto module {module}")
            elif "fake" in module.lower() and not (module in _OWN_FAKE_MODULES and file_name in _OWN_FAKE_EXPORTERS):
                found.append(f"line {node.lineno} imports the fake {module}")
            for name in names:
                if name.endswith(("_pb2", "_pb2_grpc")) or name == "v1":
                    found.append(f"line {node.lineno} imports the generated proto module {module}.{name}")
                elif name.lower().startswith("fake") and not (
                    module.startswith("dlrover.launcher.") and file_name in _OWN_FAKE_EXPORTERS
                ):
                    found.append(f"line {node.lineno} imports the fake {name} from {module}")
    return found


def test_the_import_scan_finds_protos_and_fakes() -> None:
    """The scan below would catch what issue 27 removed, and leaves domain imports alone."""
    assert forbidden_imports("from dlrover.master.v1 import agent_pb2\n", "agent.py")
    assert forbidden_imports("from dlrover.rendezvous.v1 import rendezvous_pb2_grpc\n", "agent.py")
    assert forbidden_imports("import dlrover.master.v1.job_pb2\n", "agent.py")
    assert forbidden_imports("from dlrover.master import v1\n", "agent.py")
    assert forbidden_imports("from dlrover.master import FakeScheduler\n", "agent.py")
    assert forbidden_imports("from dlrover.master.scheduler.fake import x\n", "agent.py")
    assert forbidden_imports("from dlrover.launcher.fake_control import FakeControlPlane\n", "agent.py")
    assert not forbidden_imports("from dlrover.launcher.fake_control import FakeControlPlane\n", "__init__.py")
    assert not forbidden_imports("from dlrover.master import MasterClient, JobSummary\n", "agent.py")
    assert not forbidden_imports("from dlrover.launcher.store_host import FakeStoreHost\n", "__init__.py")
    assert forbidden_imports("from dlrover.launcher.store_host import FakeStoreHost\n", "cli.py")


def test_the_launcher_imports_no_proto_module_and_nothing_from_a_fake() -> None:
    """`MasterClient` answers in domain types, so the agent needs no generated proto module (of
    the master or any other package); and product code takes nothing from a fake (the master's
    `FakeScheduler`; the launcher's own `FakeControlPlane` and `FakeStoreHost` only where they are
    defined and lazily exported)."""
    offenders = [
        f"{path.relative_to(ROOT)}: {finding}"
        for path in sorted(LAUNCHER.rglob("*.py"))
        for finding in forbidden_imports(path.read_text(encoding="utf-8"), path.name)
    ]
    assert not offenders, "\n".join(offenders)
