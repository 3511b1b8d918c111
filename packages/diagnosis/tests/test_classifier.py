"""Rules, the registry (including real entry-point plugins) and the classifier's decisions."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.diagnosis import (
    ENTRY_POINT_GROUP,
    NO_OOM_KILL,
    Evidence,
    ExceptionRule,
    FailureKind,
    FunctionRule,
    LogPatternRule,
    LossSample,
    ProbeResult,
    ResourceSample,
    RulePluginError,
    RuleRegistry,
    builtin_rules,
    classify,
)
from dlrover.diagnosis.rules import Scanner, matching_lines
from dlrover.diagnosis.scan import SKELETON_MIN_CHARS


@pytest.fixture
def registry() -> RuleRegistry:
    return RuleRegistry.with_builtin_rules()


def _write_plugin(root: Path, dist: str, module: str, source: str, entry: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry}\n")


def test_builtin_rules_are_fresh_and_uniquely_named() -> None:
    a, b = builtin_rules(), builtin_rules()
    assert [r.name for r in a] == [r.name for r in b]
    assert len({r.name for r in a}) == len(a)
    assert RuleRegistry(a).names() == tuple(r.name for r in a)


def test_registry_rejects_duplicates_and_bad_rules_without_changing() -> None:
    reg = RuleRegistry([LogPatternRule("a", FailureKind.HANG, 0.5, ["x"])])
    with pytest.raises(ConfigError, match="'a' is already registered"):
        reg.register_all(
            [LogPatternRule("b", FailureKind.HANG, 0.5, ["y"]), LogPatternRule("a", FailureKind.HANG, 0.5, ["z"])]
        )
    assert reg.names() == ("a",)
    with pytest.raises(ConfigError, match="not a rule"):
        reg.register(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="confidence"):
        LogPatternRule("c", FailureKind.HANG, 1.5, ["x"])
    assert reg.unregister("a").name == "a"
    with pytest.raises(KeyError, match="no rule named 'a'"):
        reg.unregister("a")


def test_entry_point_plugin_is_loaded_and_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_plugin(
        tmp_path,
        "acme_rules",
        "acme_rules_mod",
        """
        from dlrover.diagnosis import FailureKind, LogPatternRule
        RULES = [LogPatternRule("acme-license", FailureKind.USER_CODE, 0.99, [r"ACME license expired"])]
        """,
        "acme = acme_rules_mod:RULES",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acme_rules_mod", raising=False)
    reg = RuleRegistry.with_builtin_rules()
    assert reg.load_entry_points() == ("acme-license",)
    diagnosis = classify(Evidence.from_text("NCCL error: boom\nACME license expired at 12:00\n", returncode=1), reg)
    assert diagnosis.kind is FailureKind.USER_CODE
    assert diagnosis.rule == "acme-license"
    assert diagnosis.lines == ("ACME license expired at 12:00",)
    monkeypatch.delitem(sys.modules, "acme_rules_mod", raising=False)


def test_broken_plugin_raises_a_clear_error_and_registers_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _write_plugin(
        tmp_path,
        "good_rules",
        "good_rules_mod",
        """
        from dlrover.diagnosis import FailureKind, LogPatternRule
        def rules():
            return LogPatternRule("good", FailureKind.HANG, 0.5, ["zzz"])
        """,
        "good = good_rules_mod:rules",
    )
    other = tmp_path / "other"
    other.mkdir()
    _write_plugin(
        other, "broken_rules", "broken_rules_mod", "import does_not_exist_anywhere\n", "bad = broken_rules_mod:RULES"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(other))
    reg = RuleRegistry.with_builtin_rules()
    before = reg.names()
    with pytest.raises(RulePluginError, match=r"'bad = broken_rules_mod:RULES'.*broken_rules.*ModuleNotFoundError"):
        reg.load_entry_points()
    assert reg.names() == before
    for name in ("good_rules_mod", "broken_rules_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_plugin_that_is_not_a_rule_or_clashes_is_rejected() -> None:
    ep_bad = metadata.EntryPoint(name="x", value="builtins:len", group=ENTRY_POINT_GROUP)
    reg = RuleRegistry.with_builtin_rules()
    with pytest.raises(RulePluginError, match=r"'x = builtins:len'.*not a valid rule plugin"):
        reg.load_entry_points(entry_points=[ep_bad])
    ep_int = metadata.EntryPoint(name="y", value="math:pi", group=ENTRY_POINT_GROUP)
    with pytest.raises(RulePluginError, match="neither a rule"):
        reg.load_entry_points(entry_points=[ep_int])
    # A rule named like a built-in one clashes.
    ep_dup = metadata.EntryPoint(name="z", value="dlrover.diagnosis:builtin_rules", group=ENTRY_POINT_GROUP)
    with pytest.raises(RulePluginError, match="already registered"):
        reg.load_entry_points(entry_points=[ep_dup])
    assert len(reg) == len(builtin_rules())
    assert reg.load_entry_points(entry_points=[]) == ()


def test_a_raising_rule_is_reported_and_skipped(registry: RuleRegistry) -> None:
    def explode(_ev: Evidence) -> Sequence[str]:
        raise ZeroDivisionError("plugin bug")

    registry.register(FunctionRule("exploding", FailureKind.HARDWARE, 1.0, explode))
    diagnosis = classify(Evidence.from_text("torch.OutOfMemoryError: CUDA out of memory.\n"), registry)
    assert diagnosis.kind is FailureKind.DEVICE_OOM
    assert diagnosis.rule_errors == ("rule 'exploding' raised ZeroDivisionError: plugin bug",)


def test_user_code_error_is_never_transient_even_when_outweighed(registry: RuleRegistry) -> None:
    # A weak user error (KeyError) beside a stronger preemption notice.
    text = "Traceback (most recent call last):\nKeyError: 'lr'\nReceived SIGTERM, shutting down\n"
    diagnosis = classify(Evidence.from_text(text, returncode=1), registry)
    assert diagnosis.kind is FailureKind.USER_CODE
    assert "never treated as transient" in diagnosis.reason
    assert not diagnosis.transient


@pytest.mark.parametrize(
    ("cause", "kind"),
    [
        ("Traceback (most recent call last):\nKeyError: 'lr'", FailureKind.USER_CODE),
        ("Segmentation fault (core dumped)", FailureKind.NATIVE_CRASH),
        ("Killed", FailureKind.HOST_OOM),
        ("OSError: [Errno 28] No space left on device", FailureKind.DISK_FULL),
    ],
)
def test_communication_errors_are_the_aftermath_of_any_other_failure(
    registry: RuleRegistry, cause: str, kind: FailureKind
) -> None:
    # Peers of a rank that failed see broken connections and timed-out collectives, with more
    # confidence than the (often weak) sign of the failure itself.
    peers = (
        "[E ProcessGroupNCCL.cpp:828] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n"
        "RuntimeError: Connection reset by peer\n"
    )
    diagnosis = classify(Evidence.from_text(cause + "\n" + peers), registry)
    assert diagnosis.kind is kind
    # Said so where the cause's own evidence was the weaker.
    assert "aftermath" in diagnosis.reason or diagnosis.confidence > 0.75
    alone = classify(Evidence.from_text(peers), registry)
    assert alone.kind is FailureKind.COMMUNICATION


def test_ties_follow_precedence() -> None:
    reg = RuleRegistry(
        [
            LogPatternRule("c", FailureKind.COMMUNICATION, 0.8, ["boom"]),
            LogPatternRule("h", FailureKind.HARDWARE, 0.8, ["boom"]),
        ]
    )
    assert classify(Evidence.from_text("boom"), reg).kind is FailureKind.HARDWARE


def test_structured_evidence_rules(registry: RuleRegistry) -> None:
    nan = classify(Evidence(losses=(LossSample(1, 1.0), LossSample(2, float("nan")))), registry)
    assert nan.kind is FailureKind.NAN_LOSS
    assert nan.lines == ("rank 0 reported loss nan at step 2",)
    probe = classify(Evidence(probes=(ProbeResult(0, 2, False, error="timed out", node_id="n1"),)), registry)
    assert probe.kind is FailureKind.HARDWARE
    assert "n1" in probe.lines[0]
    full = ResourceSample(0.0, 10.0, 10, host_memory_used_bytes=99, host_memory_total_bytes=100)
    oom = classify(Evidence.from_text("", returncode=-9, resources=[full]), registry)
    assert oom.kind is FailureKind.HOST_OOM
    # A SIGKILL whose OOM records were read and show no kill is a killed process, said as such; not
    # a preemption, not unknown. With no record read it is presumed the OOM killer's (weakly).
    no_kill = f"{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at 0 while the workers ran (x)"
    killed = classify(Evidence.from_text(no_kill, returncode=-9), registry)
    assert killed.kind is FailureKind.KILLED
    assert killed.confidence < 0.6
    assert killed.lines == ("killed by SIGKILL (signal 9): out of memory on the host or killed by someone",)
    assert classify(Evidence.from_text(no_kill, returncode=137), registry).kind is FailureKind.KILLED
    unrecorded = classify(Evidence.from_text("", returncode=137), registry)
    assert (unrecorded.kind, unrecorded.rule) == (FailureKind.HOST_OOM, "sigkill-exit-unrecorded")
    assert unrecorded.confidence < 0.5
    # SIGTERM stays the sign of a node being taken away.
    assert classify(Evidence.from_text("", returncode=-15), registry).kind is FailureKind.PREEMPTION


def test_torchrun_sigterm_chatter_is_not_preemption(registry: RuleRegistry) -> None:
    text = "W1121 api.py:897] Sending process 140252 closing signal SIGTERM\n"
    assert classify(Evidence.from_text(text, returncode=1), registry).kind is FailureKind.UNKNOWN


def test_fp16_overflow_chatter_is_not_nan_loss(registry: RuleRegistry) -> None:
    text = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0\nstep 3 loss 2.1\n"
    assert classify(Evidence.from_text(text, returncode=1), registry).kind is FailureKind.UNKNOWN


def test_xid_codes_are_judged_by_number(registry: RuleRegistry) -> None:
    hw = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    app = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python, Graphics SM Warp Exception"
    assert classify(Evidence.from_text(hw), registry).kind is FailureKind.HARDWARE
    assert classify(Evidence.from_text(app), registry).kind is FailureKind.UNKNOWN


def test_exception_rule_matches_message_and_name() -> None:
    rule = ExceptionRule("r", FailureKind.DATA_ERROR, 0.7, {"OSError"}, r"truncated")
    ev = Evidence.from_text("Traceback (most recent call last):\nOSError: image file is truncated\nOSError: other\n")
    assert tuple(rule.match(ev)) == ("OSError: image file is truncated",)
    with pytest.raises(ConfigError, match="needs exception names or a message"):
        ExceptionRule("r", FailureKind.DATA_ERROR, 0.7, ())


def test_diagnosis_is_frozen(registry: RuleRegistry) -> None:
    d = classify(Evidence(), registry)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        d.kind = FailureKind.HANG  # type: ignore[misc]


_PATTERNS = [
    r"a\s+b",
    r"^b",
    r"a$",
    r"\bab\b",
    r"b[^,]{0,3}?a",
    r"(?:x|a)\s*\n?\s*b",
    "A",
    r"x*",
    r"is\b",
    r"k[a-z]",
    r"\W+s",
    r"\x41b",
    # Patterns with literal anchors (found with str.find before the pattern is tried).
    r"kis",
    r"\bsab\b",
    r"(?:abs|kix)\s*sa",
    r"(ab|ss)(?=k)kk",
    r"(?i:ska)b",
    r"(?-i:ABS)x",
    r"sss+|aab",
    r"(?:abk){1,2}",
    r"a(?!b)ksa",
    r"x\u0130s|\u212aab",
]
# Letters that case-fold in surprising ways, so the fast lower-cased scan is checked against them.
_ALPHABET = "abABsSkKix ,\t\u0130\u0131\u017f\u212a\u00df\u03a3\u03c3\u03c2"


@given(
    lines=st.lists(st.text(alphabet=_ALPHABET, max_size=12), max_size=12),
    chosen=st.lists(st.sampled_from(_PATTERNS), min_size=1, max_size=3),
    ignore_case=st.booleans(),
)
def test_whole_text_scan_finds_exactly_the_lines_a_per_line_search_finds(
    lines: list[str], chosen: list[str], ignore_case: bool
) -> None:
    evidence = Evidence.from_text("\n".join(lines) + "\n")
    flags = re.IGNORECASE if ignore_case else 0
    compiled = [re.compile(p, flags) for p in chosen]
    expected = [i for i, line in enumerate(evidence.lines()) if any(p.search(line) for p in compiled)]
    assert matching_lines(evidence, [Scanner.of(p) for p in compiled]) == expected


# Patterns with digits in their anchors: a long text is searched in its skeleton first, where
# every digit is written as 0.
_LONG_PATTERNS = [*_PATTERNS, r"kis 7\d", r"step 12 ab", r"\bxid 79\b", r"9s"]


@given(
    lines=st.lists(st.text(alphabet=_ALPHABET + "0179", max_size=12), max_size=12),
    chosen=st.lists(st.sampled_from(_LONG_PATTERNS), min_size=1, max_size=3),
    ignore_case=st.booleans(),
)
def test_long_text_scan_finds_exactly_the_lines_a_per_line_search_finds(
    lines: list[str], chosen: list[str], ignore_case: bool
) -> None:
    # Progress lines that repeat with other numbers make the text long and its skeleton short.
    progress = [f"step {i} loss 0.{i % 97} xid 7{i % 10} kis 8{i % 10}" for i in range(1500)]
    assert len("\n".join(progress)) > SKELETON_MIN_CHARS
    evidence = Evidence.from_text("\n".join(progress[:700] + lines + progress[700:]) + "\n")
    flags = re.IGNORECASE if ignore_case else 0
    compiled = [re.compile(p, flags) for p in chosen]
    expected = [i for i, line in enumerate(evidence.lines()) if any(p.search(line) for p in compiled)]
    assert matching_lines(evidence, [Scanner.of(p) for p in compiled]) == expected


@pytest.mark.parametrize(
    ("line", "pattern"),
    [("x\u017f", r"xs"), ("\u212a", r"k"), ("\u0131s", r"is\b"), ("a\u0130", r"ai"), ("NCCL Error", r"nccl error")],
)
def test_folded_scan_agrees_with_ignorecase_on_odd_letters(line: str, pattern: str) -> None:
    compiled = re.compile(pattern, re.IGNORECASE)
    assert compiled.search(line)  # what IGNORECASE says
    evidence = Evidence.from_text(f"noise\n{line}\nmore noise\n")
    assert matching_lines(evidence, [Scanner.of(compiled)]) == [1]


def test_patterns_get_the_literal_anchors_every_match_contains() -> None:
    def anchors(pattern: str, flags: int = re.IGNORECASE) -> tuple[frozenset[str], ...]:
        return Scanner.of(re.compile(pattern, flags)).anchors

    assert anchors(r"GPU is lost") == (frozenset({"gpu is lost"}),)
    assert anchors(r"GPU is lost", 0) == (frozenset({"gpu is lost"}),)  # searched in the folded text
    assert anchors(r"\bNCCL error\b") == (frozenset({"nccl error"}),)  # zero-width \b keeps the run
    assert anchors(r"(received|got) (signal )?SIGTERM") == (frozenset({"sigterm"}), frozenset({"received", "got"}))
    assert anchors(r"Segmentation fault|segfault") == (frozenset({"segmentation fault", "segfault"}),)
    # An alternative without a literal, too short a literal, or an optional part: no anchor.
    assert anchors(r"GPU lost|\d+ xid") == (frozenset({"gpu lost", " xid"}),)
    assert anchors(r"GPU lost|\d+") == ()
    assert anchors(r"ab\s+cd") == ()
    assert anchors(r"(?:lost)?\d+") == ()


def test_a_node_left_out_by_the_node_check_is_a_hardware_fault_despite_the_probes_gloo_errors() -> None:
    from dlrover.diagnosis import NODE_CHECK_FAILED, classify

    log = (
        f"{NODE_CHECK_FAILED}: the network check left this node out before training\n"
        "round 1 pair 0-1: failed (node 0: RuntimeError: [gloo] Timed out waiting 3000ms for recv; node 1: ok)\n"
        "torch.distributed.DistNetworkError: Connection reset by peer\n"
    )
    diagnosis = classify(Evidence.from_text(log, returncode=1), RuleRegistry.with_builtin_rules())
    assert diagnosis.kind is FailureKind.HARDWARE
    assert NODE_CHECK_FAILED in diagnosis.reason or "node-check-failed" in diagnosis.reason
    # The same probe errors without the marker stay a communication failure.
    plain = classify(Evidence.from_text(log.split("\n", 1)[1], returncode=1), RuleRegistry.with_builtin_rules())
    assert plain.kind is FailureKind.COMMUNICATION


def test_a_second_registry_reuses_the_first_ones_prepared_patterns() -> None:
    # Each policy and master builds its registry; the patterns (several hundred, more than `re`'s
    # own cache holds) are compiled and parsed for their anchors once per process, not per build.
    from dlrover.diagnosis.rules import LogPatternRule

    first, second = RuleRegistry.with_builtin_rules(), RuleRegistry.with_builtin_rules()
    pairs = [(a, b) for a, b in zip(first.rules, second.rules, strict=True) if isinstance(a, LogPatternRule)]
    assert pairs
    for a, b in pairs:
        assert all(p is q for p, q in zip(a.patterns, b.patterns, strict=True)), a.name
        assert all(s is t for s, t in zip(a._scanners, b._scanners, strict=True)), a.name
