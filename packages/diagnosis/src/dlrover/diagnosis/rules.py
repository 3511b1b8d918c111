"""Classifier rules: small objects with a name, a kind, a confidence and a match function.

A rule looks at `Evidence` and returns the lines that made it match (log lines, or sentences it
writes about structured evidence such as an exit status); an empty result means no match. Rules
never raise on odd input and never do I/O.

Third-party rules follow the same `Rule` protocol (see `dlrover.diagnosis.registry`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from dlrover.common import ConfigError
from dlrover.diagnosis.anchors import anchors_of
from dlrover.diagnosis.evidence import Evidence
from dlrover.diagnosis.exitinfo import ExitInfo
from dlrover.diagnosis.kinds import NODE_CHECK_FAILED, FailureKind
from dlrover.diagnosis.logsignals import signal_in_log
from dlrover.diagnosis.logtail import fold_case
from dlrover.diagnosis.oomrecord import MEMORY_RECORD, NO_OOM_KILL
from dlrover.diagnosis.scan import Scanner, matching_lines
from dlrover.diagnosis.tracebacks import PythonTraceback, strip_rank_prefix

__all__ = [
    "NODE_CHECK_FAILED",
    "ExceptionRule",
    "FunctionRule",
    "LogPatternRule",
    "Rule",
    "Scanner",
    "builtin_rules",
    "killed_words",
    "matching_lines",
    "validate_rule",
]

MAX_LINES_PER_MATCH = 5
"""A rule reports at most this many deciding lines, the last ones (closest to the failure)."""


@runtime_checkable
class Rule(Protocol):
    """What the classifier needs from a rule."""

    @property
    def name(self) -> str:
        """A unique, stable name (``"cuda-oom"``), shown in the diagnosis."""
        ...

    @property
    def kind(self) -> FailureKind:
        """The failure kind a match points to."""
        ...

    @property
    def confidence(self) -> float:
        """How sure a match makes us, in (0, 1]; the highest-confidence match wins."""
        ...

    def match(self, evidence: Evidence) -> Sequence[str]:
        """The evidence lines that decided, or an empty sequence when the rule does not apply."""
        ...


def validate_rule(obj: object, *, origin: str = "") -> Rule:
    """Check that `obj` is a usable rule and return it.

    Args:
        obj: the candidate.
        origin: where it came from, for the error message.

    Returns:
        `obj`, typed as a `Rule`.

    Raises:
        ConfigError: naming the bad attribute and value.
    """
    where = f" (from {origin})" if origin else ""
    if not isinstance(obj, Rule):
        raise ConfigError(f"{obj!r}{where} is not a rule: it needs name, kind, confidence and match(evidence)")
    name = obj.name
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"rule name must be a non-empty string, got {name!r}{where}")
    if not isinstance(obj.kind, FailureKind):
        raise ConfigError(f"rule {name!r}{where}: kind must be a FailureKind, got {obj.kind!r}")
    conf = obj.confidence
    if not isinstance(conf, int | float) or isinstance(conf, bool) or not (0.0 < conf <= 1.0):
        raise ConfigError(f"rule {name!r}{where}: confidence must be in (0, 1], got {conf!r}")
    if not callable(getattr(obj, "match", None)):
        raise ConfigError(f"rule {name!r}{where}: match is not callable")
    return obj


def _check_common(name: str, confidence: float) -> None:
    if not name:
        raise ConfigError("rule name must be a non-empty string")
    if not (0.0 < confidence <= 1.0):
        raise ConfigError(f"rule {name!r}: confidence must be in (0, 1], got {confidence!r}")


def _compile(patterns: Iterable[str | re.Pattern[str]]) -> tuple[re.Pattern[str], ...]:
    return tuple(p if isinstance(p, re.Pattern) else _compiled(p) for p in patterns)


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    # The built-in rules hold more patterns than `re`'s own cache (512), which they would thrash:
    # every registry built after the first compiled them all again (a third of a second).
    return re.compile(pattern, re.IGNORECASE)


def _names(names: Iterable[str]) -> frozenset[str]:
    return frozenset(names)


def _optional_pattern(pattern: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    return None if pattern is None else _compile([pattern])[0]


def _last(lines: list[str]) -> tuple[str, ...]:
    return tuple(lines[-MAX_LINES_PER_MATCH:])


@attrs.frozen
class LogPatternRule:
    """Matches log lines against regular expressions (case-insensitive unless precompiled).

    Attributes:
        name: the rule's name.
        kind: the kind a match points to.
        confidence: in (0, 1].
        patterns: a line matches when any of these is found in it.
        unless: a line that also matches any of these is ignored (known noise).
    """

    name: str
    kind: FailureKind
    confidence: float
    patterns: tuple[re.Pattern[str], ...] = attrs.field(converter=_compile)
    unless: tuple[re.Pattern[str], ...] = attrs.field(default=(), converter=_compile)
    _scanners: tuple[Scanner, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _check_common(self.name, self.confidence)
        if not self.patterns:
            raise ConfigError(f"rule {self.name!r} needs at least one pattern")
        object.__setattr__(self, "_scanners", tuple(Scanner.of(p) for p in self.patterns))

    def match(self, evidence: Evidence) -> Sequence[str]:
        """The last log lines that match a pattern and no `unless` pattern."""
        lines = evidence.lines()
        hits = [
            lines[i]
            for i in matching_lines(evidence, self._scanners)
            if not any(u.search(lines[i]) for u in self.unless)
        ]
        return _last(hits)


@attrs.frozen
class ExceptionRule:
    """Matches Python exceptions found in the log by class name, and optionally by message.

    Attributes:
        name: the rule's name.
        kind: the kind a match points to.
        confidence: in (0, 1].
        exc_names: class names without module (``"TypeError"``); empty matches any class.
        message: when set, the exception message must match it too.
    """

    name: str
    kind: FailureKind
    confidence: float
    exc_names: frozenset[str] = attrs.field(converter=_names)
    message: re.Pattern[str] | None = attrs.field(default=None, converter=_optional_pattern)
    _message_anchors: tuple[frozenset[str], ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _check_common(self.name, self.confidence)
        if not self.exc_names and self.message is None:
            raise ConfigError(f"rule {self.name!r} needs exception names or a message pattern")
        anchors = () if self.message is None else anchors_of(self.message)
        object.__setattr__(self, "_message_anchors", anchors)

    def _message_matches(self, message: str) -> bool:
        if self.message is None:
            return True
        if self._message_anchors:
            # Most messages hold none of the pattern's literals: a substring test says so faster.
            folded = fold_case(message)
            if folded and not all(any(a in folded for a in anchors) for anchors in self._message_anchors):
                return False
        return self.message.search(message) is not None

    def match(self, evidence: Evidence) -> Sequence[str]:
        """The log lines (as printed, rank prefix included) of matching exceptions."""
        lines = evidence.lines()
        hits = [
            lines[tb.line_index] if tb.line_index < len(lines) else tb.exception_line
            for tb in evidence.tracebacks
            if (not self.exc_names or tb.exc_name in self.exc_names) and self._message_matches(tb.message)
        ]
        return _last(hits)


@attrs.frozen
class FunctionRule:
    """A rule whose match is any function of the evidence; the way to write structured rules.

    Attributes:
        name: the rule's name.
        kind: the kind a match points to.
        confidence: in (0, 1].
        fn: returns the deciding lines, empty for no match.
    """

    name: str
    kind: FailureKind
    confidence: float
    fn: Callable[[Evidence], Sequence[str]]

    def __attrs_post_init__(self) -> None:
        _check_common(self.name, self.confidence)

    def match(self, evidence: Evidence) -> Sequence[str]:
        """Whatever `fn` returns."""
        return tuple(self.fn(evidence))[-MAX_LINES_PER_MATCH:]


# ---- structured rules -----------------------------------------------------------------------

# Xid codes NVIDIA documents as hardware, driver-to-board or memory faults. Codes such as 13, 31
# and 43 usually follow an application fault and are left to the other rules.
# 144-150 are the NVLink fault codes of recent drivers.
_HARDWARE_XIDS = frozenset(
    {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140, 144, 145, 146, 147, 148, 149, 150, 154}
)
# The kernel's "NVRM: Xid (PCI:0000:3b:00): 79", and "Xid 79" / "Xid=79" as DCGM and the Kubernetes
# device plugin write it.
_XID = re.compile(r"\bXid\b\s*(?:\([^)]*\))?\s*[:=]?\s*(\d+)", re.IGNORECASE)
# A follow-up Xid (45: channel torn down) names the fault that caused it.
_CAUSED_BY_XID = re.compile(r"caused by previous Xid\s*(\d+)", re.IGNORECASE)


_XID_SCANNERS = (Scanner.of(_XID), Scanner.of(_CAUSED_BY_XID))


def _xid_lines(codes_wanted: frozenset[int]) -> Callable[[Evidence], Sequence[str]]:
    def match(evidence: Evidence) -> Sequence[str]:
        hits = []
        lines = evidence.lines()
        for index in matching_lines(evidence, _XID_SCANNERS):
            line = lines[index]
            codes = [int(m.group(1)) for m in (_XID.search(line), _CAUSED_BY_XID.search(line)) if m is not None]
            if any(code in codes_wanted for code in codes):
                hits.append(line)
        return hits

    return match


_hardware_xid = _xid_lines(_HARDWARE_XIDS)


def _non_finite_loss(evidence: Evidence) -> Sequence[str]:
    return [
        f"rank {s.rank} reported loss {s.value!r} at step {s.step}"
        for s in evidence.losses
        if not math.isfinite(s.value)
    ]


# A loss scaler that keeps halving: every step overflows, the fp16 form of a diverged loss.
_LOSS_SCALE = re.compile(
    r"(?:(?<!\w)loss[ _]scale\w*\s*[:=]?\s*|(?:reducing|setting|decreasing|lowering) (?:the )?(?:dynamic )?"
    r"loss scale (?:from \S+ )?to:?\s*)([0-9][0-9.e+-]*)",
    re.IGNORECASE,
)
LOSS_SCALE_FALLS = 6
"""This many consecutive falls of the printed loss scale mean the loss diverged (a healthy fp16
run lowers it a few times at the start, then it climbs back)."""


_LOSS_SCALE_SCANNER = (Scanner.of(_LOSS_SCALE),)


def _scale_in(line: str) -> re.Match[str] | None:
    """The last loss scale a line names: apex writes the index of its scaler before the value it
    falls to ("loss scaler 0 reducing loss scale to 0.5")."""
    found = list(_LOSS_SCALE.finditer(line))
    return found[-1] if found else None


def _falling_loss_scale(evidence: Evidence) -> Sequence[str]:
    falls: list[str] = []
    previous: float | None = None
    lines = evidence.lines()
    for index in matching_lines(evidence, _LOSS_SCALE_SCANNER):
        line = lines[index]
        m = _scale_in(line)
        if m is None:
            continue
        try:
            value = float(m.group(1).rstrip(".-+e"))
        except ValueError:
            continue
        if previous is not None and value < previous:
            falls.append(line)
        elif previous is not None:
            falls = []
        previous = value
    return falls if len(falls) >= LOSS_SCALE_FALLS else ()


def _loss_scales(evidence: Evidence) -> list[tuple[float, str]]:
    lines = evidence.lines()
    found = []
    for index in matching_lines(evidence, _LOSS_SCALE_SCANNER):
        m = _scale_in(lines[index])
        if m is None:
            continue
        try:
            found.append((float(m.group(1).rstrip(".-+e")), lines[index]))
        except ValueError:
            continue
    return found


def _collapsed_loss_scale(evidence: Evidence) -> Sequence[str]:
    """A dynamic loss scale halved below 1: every step for many steps overflowed (a healthy fp16
    run keeps it in the thousands; 0 is the configuration's "dynamic", not a value)."""
    return [line for value, line in _loss_scales(evidence) if 0.0 < value < 1.0]


# DeepSpeed's scaler names the scale it tried and the one it falls to; the same value at or below
# 1 (its default floor, `min_loss_scale`) means it cannot fall any more: every step overflows.
_SCALE_STEP = re.compile(r"Attempted loss scale: ([0-9][0-9.e+-]*),? reducing to ([0-9][0-9.e+-]*)", re.IGNORECASE)
_SCALE_STEP_SCANNER = (Scanner.of(_SCALE_STEP),)


def _loss_scale_at_floor(evidence: Evidence) -> Sequence[str]:
    lines = evidence.lines()
    hits = []
    for index in matching_lines(evidence, _SCALE_STEP_SCANNER):
        m = _SCALE_STEP.search(lines[index])
        if m is None:
            continue
        try:
            tried, next_scale = (float(g.rstrip(".-+e")) for g in m.groups())
        except ValueError:
            continue
        if tried == next_scale <= 1.0:
            hits.append(lines[index])
    return hits


# A row of a trainer's metrics table with NaN in two columns side by side (YOLO's, mmdetection's
# and Keras' per-epoch tables), under a header or beside words that name a loss.
_NAN_COLUMNS = re.compile(r"(?<!\S)nan\s+nan(?!\S)", re.IGNORECASE)
_NAN_COLUMNS_SCANNER = (Scanner.of(_NAN_COLUMNS),)
LOSS_HEADER_LOOKBACK_LINES = 20
"""How far above a row of NaN columns the header naming a loss is looked for."""


def _nan_loss_columns(evidence: Evidence) -> Sequence[str]:
    lines = evidence.lines()
    hits = []
    for index in matching_lines(evidence, _NAN_COLUMNS_SCANNER):
        window = lines[max(0, index - LOSS_HEADER_LOOKBACK_LINES) : index + 1]
        if any("loss" in line.lower() for line in window):
            hits.append(lines[index])
    return hits


def _hang_reported(evidence: Evidence) -> Sequence[str]:
    report = evidence.hang
    if report is None or not report.hung:
        return ()
    return [report.reason]


def _failed_probe(evidence: Evidence) -> Sequence[str]:
    return [
        f"health probe failed on rank {p.rank}{' (node ' + p.node_id + ')' if p.node_id else ''}: {p.error}"
        for p in evidence.probes
        if not p.ok
    ]


def _exit_signal(*signums: int) -> Callable[[Evidence], Sequence[str]]:
    def match(evidence: Evidence) -> Sequence[str]:
        if evidence.exit is not None and evidence.exit.signal in signums:
            return [f"the process ended with {evidence.exit.describe()}"]
        return ()

    return match


_SIGHUP, _SIGILL, _SIGABRT, _SIGBUS, _SIGFPE, _SIGKILL, _SIGSEGV, _SIGTERM = 1, 4, 6, 7, 8, 9, 11, 15
HOST_MEMORY_FULL_FRACTION = 0.95


def _killed_with_full_memory(evidence: Evidence) -> Sequence[str]:
    if evidence.exit is None or evidence.exit.signal != _SIGKILL or not evidence.resources:
        return ()
    last = evidence.resources[-1]
    if last.host_memory_fraction < HOST_MEMORY_FULL_FRACTION:
        return ()
    return [
        f"the process ended with {evidence.exit.describe()} while host memory was "
        f"{last.host_memory_fraction:.0%} used ({last.host_memory_used_bytes} of {last.host_memory_total_bytes} bytes)"
    ]


def killed_words(exit_info: ExitInfo) -> str:
    """What a SIGKILL means whose OOM records show no kill: ``"killed by SIGKILL (signal 9): out of
    memory on the host or killed by someone"`` (an OOM killer the records do not count, or a
    person or a tool)."""
    return (
        f"killed by {exit_info.signal_name} (signal {exit_info.signal}): out of memory on the host or killed by someone"
    )


def _has_line_starting(evidence: Evidence, prefix: str) -> bool:
    text = evidence.text
    return text.startswith(prefix) or f"\n{prefix}" in text


def _killed(evidence: Evidence) -> Sequence[str]:
    if evidence.exit is None or evidence.exit.signal != _SIGKILL or not _has_line_starting(evidence, NO_OOM_KILL):
        return ()
    return [killed_words(evidence.exit)]


def _killed_unrecorded(evidence: Evidence) -> Sequence[str]:
    if evidence.exit is None or evidence.exit.signal != _SIGKILL or _has_line_starting(evidence, MEMORY_RECORD):
        return ()
    return [f"{evidence.exit.describe()} with no OOM record read: most often the OOM killer, out of memory on the host"]


def _log_patterns(*patterns: str) -> Callable[[Evidence], Sequence[str]]:
    scanners = tuple(Scanner.of(p) for p in _compile(patterns))

    def match(evidence: Evidence) -> Sequence[str]:
        lines = evidence.lines()
        return [lines[i] for i in matching_lines(evidence, scanners)]

    return match


# The collective watchdog aborts its process on purpose (std::terminate, SIGABRT) after a
# collective failed, and so does its heartbeat monitor when the watchdog itself is stuck: that
# abort is the communication failure's or the hang's, not a native crash. So is the abort of a
# process whose collective or store library let its own network exception escape a thread
# (c10d's DistNetworkError and DistStoreError, gloo's IoException: a read, write or wait on a
# peer's or the store's socket failed or timed out).
_WATCHDOG_ABORT = (
    Scanner.of(
        re.compile(
            r"taking the entire process down|watchdog thread terminated with exception|"
            r"instance of 'c10::Dist(Backend|Network|Store)Error'|instance of 'gloo::IoException'|"
            r"what\(\):.*\b(NCCL error|Watchdog caught)|"
            r"watchdog got stuck for|Heartbeat monitor timed out",
            re.IGNORECASE,
        )
    ),
)


def _watchdog_abort_lines(evidence: Evidence) -> list[int]:
    return matching_lines(evidence, _WATCHDOG_ABORT)


def _unless_watchdog_abort(fn: Callable[[Evidence], Sequence[str]]) -> Callable[[Evidence], Sequence[str]]:
    def match(evidence: Evidence) -> Sequence[str]:
        if evidence.derived("dlrover.watchdog_abort", _watchdog_abort_lines):
            return ()
        return fn(evidence)

    return match


# Exceptions that mean the script itself is wrong: restarting it runs the same bug again.
_USER_EXCEPTIONS = frozenset(
    {
        "ImportError",
        "ModuleNotFoundError",
        "SyntaxError",
        "IndentationError",
        "TabError",
        "NameError",
        "UnboundLocalError",
        "TypeError",
        "AttributeError",
        # torch before 1.8 raised its own subclass of AttributeError for a missing module attribute.
        "ModuleAttributeError",
        "AssertionError",
        "NotImplementedError",
        "ZeroDivisionError",
        "RecursionError",
    }
)
# Usually a bug too, but also raised for bad data; weaker so a data rule can outrank them.
_WEAK_USER_EXCEPTIONS = frozenset({"KeyError", "IndexError", "ValueError"})
# torch raises these as RuntimeError; the message says the program is wrong.
_USER_RUNTIME_MESSAGES = (
    r"shapes cannot be multiplied",
    r"size mismatch",
    r"Expected all tensors to be on the same device",
    r"Error\(s\) in loading state_dict",
    r"device-side assert triggered",
    r"does not require grad and does not have a grad_fn",
    r"backward through the graph a second time",
    r"The size of tensor a \(\d+\) must match",
    r"Expected .* to have \d+ channels",
    r"expected scalar type \w+ but found",
    r"Default process group has not been initialized",
    r"No module named '",
    r"Failed to import \S+ because of the following error",
    # Distributed data parallel and autograd used wrongly.
    r"Expected to have finished reduction in the prior iteration",
    r"Expected to mark a variable ready only once",
    r"modified by an inplace operation",
    r"not implemented for '\w+'",
    r"Input type \(\S+\) and weight type \(\S+\) should be the same",
    r"Sizes of tensors must match",
    r"index out of range in self",
    # A build of torch or an extension that does not fit the installed environment: the same
    # import fails on every restart.
    r"no kernel image is available for execution on the device",
    r"undefined symbol:",
    r"cannot open shared object file",
    r"Tensors must be CUDA and dense",
    r"Found dtype \w+ but expected \w+",
    # An extension the environment cannot build (DeepSpeed's ops, custom kernels).
    r"Error building extension",
    # Shapes, dtypes, devices and autograd used wrongly, in torch's other words.
    r"must match the existing size",
    r"is invalid for input of size",
    r"view size is not compatible with input tensor",
    r"to have the same dtype",
    r"Expected input batch_size \(\d+\) to match target batch_size",
    r"Expected target size",
    r"leaf Variable that requires grad is being used in an in-place operation",
    r"grad can be implicitly created only for scalar outputs",
    r"Can't call numpy\(\) on Tensor that requires grad",
    r"Cannot re-initialize CUDA in forked subprocess",
    r"is on (CPU|GPU), but expected (it|them) to be on",
    r"Placeholder storage has not been allocated on MPS device",
)

# argparse rejecting the rank argument torch's launchers pass to every worker.
_LOCAL_RANK_ARGUMENT = r"error: unrecognized arguments:.*--local[-_]rank\b"

# Launchers whose own code raises when their configuration is wrong, before any training script
# runs: an exception whose innermost frame is in one of these is a launch setting to fix.
_LAUNCHER_FRAMES = re.compile(r"[/\\](?:accelerate[/\\]commands|deepspeed[/\\]launcher)[/\\]")
_LAUNCHER_WRAPPERS = frozenset({"ChildFailedError", "CalledProcessError", "SignalException", "KeyboardInterrupt"})


def _exception_line(evidence: Evidence, tb: PythonTraceback) -> str:
    lines = evidence.lines()
    return lines[tb.line_index] if tb.line_index < len(lines) else tb.exception_line


def _launcher_rejected_config(evidence: Evidence) -> Sequence[str]:
    return [
        _exception_line(evidence, tb)
        for tb in evidence.tracebacks
        if tb.frames and _LAUNCHER_FRAMES.search(tb.frames[-1]) and tb.exc_name not in _LAUNCHER_WRAPPERS
    ]


# A frame in the training script itself rather than in an installed library or the interpreter.
_LIBRARY_FRAME = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python\d|<frozen |[/\\]torch[/\\]")


def _raised_in_user_code(evidence: Evidence) -> Sequence[str]:
    """Generic exceptions (KeyError, IndexError, ValueError) whose innermost frame is the
    script's own: the script raised them itself or indexed its own data structures wrongly."""
    return [
        _exception_line(evidence, tb)
        for tb in evidence.tracebacks
        if tb.exc_name in _WEAK_USER_EXCEPTIONS and tb.frames and not _LIBRARY_FRAME.search(tb.frames[-1])
    ]


# torch.distributed's rendezvous and store raise ValueError and KeyError about the launch
# environment and the network (a host that does not resolve), not about the script.
_DISTRIBUTED_FRAME = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def _weak_user_exception(evidence: Evidence) -> Sequence[str]:
    """KeyError, IndexError, ValueError anywhere but in torch.distributed's own frames."""
    return [
        _exception_line(evidence, tb)
        for tb in evidence.tracebacks
        if tb.exc_name in _WEAK_USER_EXCEPTIONS and not (tb.frames and _DISTRIBUTED_FRAME.search(tb.frames[-1]))
    ]


# A store or rendezvous that refuses the connection after the client's retries: nothing listens
# at MASTER_ADDR:MASTER_PORT, which a retry with the same settings does not change.
_REFUSED = re.compile(
    r"Connection refused|ECONNREFUSED|errno:? 111\b|No route to host|errno:? 113\b|Network is unreachable",
    re.IGNORECASE,
)
_AT_INIT = re.compile(
    r"init_process_group|_create_c10d_store|_rendezvous_handler|MASTER_ADDR|MASTER_PORT|init_method",
    re.IGNORECASE,
)


_REFUSED_SCANNER = (Scanner.of(_REFUSED),)


def _refused_at_init(evidence: Evidence) -> Sequence[str]:
    if not matching_lines(evidence, _REFUSED_SCANNER):
        return ()
    lines = evidence.lines()
    hits = [
        lines[tb.line_index] if tb.line_index < len(lines) else tb.exception_line
        for tb in evidence.tracebacks
        if _REFUSED.search(tb.exception_line) and any(_AT_INIT.search(frame) for frame in tb.frames)
    ]
    hits += [lines[i] for i in matching_lines(evidence, _REFUSED_SCANNER) if _AT_INIT.search(lines[i])]
    return hits


# A frame that validates settings: an exception raised there rejects the configuration (Megatron's
# validate_args, a dataclass of training arguments checking itself in __post_init__).
_VALIDATION_FRAME = re.compile(
    r"(?:arguments|args|argparse\w*|config\w*|configuration\w*|settings)\.py\W.*\bin "
    r"(?:validate\w*|_validate\w*|check_args|_check\w*|_do_\w*check\w*|_batch_assertion|__post_init__|parse_args)\s*$"
    r"|\bin validate_args\s*$"
)
_VALIDATION_SCANNER = (Scanner.of(re.compile(r"\bin (validate_args|_validate_args)\b")),)


def _settings_rejected(evidence: Evidence) -> Sequence[str]:
    hits = [
        _exception_line(evidence, tb)
        for tb in evidence.tracebacks
        if tb.frames and _VALIDATION_FRAME.search(tb.frames[-1]) and tb.exc_name not in _LAUNCHER_WRAPPERS
    ]
    if not hits:  # a traceback cut before its exception line still names the validating frame
        lines = evidence.lines()
        hits = [lines[i] for i in matching_lines(evidence, _VALIDATION_SCANNER)]
    return hits


# Each process of a job announces its global rank once; the same rank announced by two processes
# means the launcher gave several processes one rank (srun without --ntasks-per-node).
_RANK_ANNOUNCEMENT = re.compile(r"initializing (?:ddp|distributed): GLOBAL_RANK: (\d+), MEMBER: \d+/(\d+)", re.I)
_RANK_SCANNER = (Scanner.of(_RANK_ANNOUNCEMENT),)


def _duplicate_ranks(evidence: Evidence) -> Sequence[str]:
    lines = evidence.lines()
    seen: dict[tuple[str, str], int] = {}
    hits = []
    for index in matching_lines(evidence, _RANK_SCANNER):
        m = _RANK_ANNOUNCEMENT.search(lines[index])
        if m is None:
            continue
        key = (m.group(1), m.group(2))
        if key in seen:
            hits += [lines[seen[key]], lines[index]]
        seen.setdefault(key, index)
    return hits


# ---- a process that was blocked when its stacks were dumped or when a person interrupted it ----

_PY_SPY_THREAD = re.compile(r'^\s*Thread (?:0x[0-9A-Fa-f]+ |\d+ )?\((?:idle|active)[^)]*\): "')
_PY_SPY_SCANNER = (Scanner.of(_PY_SPY_THREAD),)
_BLOCKING_FRAME = re.compile(
    r"\bin (?:wait|get|put|acquire|__enter__|join|select|poll|recv\w*|_recv\w*|read|accept|sleep|barrier)\s*$"
)


def _blocked_process(evidence: Evidence) -> Sequence[str]:
    """A stack dump of a live process (py-spy's format: the agent's hang evidence, or a user's),
    or a KeyboardInterrupt raised while the process waited on a queue, a lock or a socket: the
    process was stuck, and someone looked or gave up."""
    lines = evidence.lines()
    hits = [lines[i] for i in matching_lines(evidence, _PY_SPY_SCANNER)]
    for tb in evidence.tracebacks:
        if tb.exc_name != "KeyboardInterrupt":
            continue
        innermost = tb.frames[-1] if tb.frames else _frame_above(lines, tb.line_index)
        if innermost and _BLOCKING_FRAME.search(innermost):
            hits.append(_exception_line(evidence, tb))
    return hits


_FRAME_LINE = re.compile(r'^\s*File "[^"]*", line \d+, in \S+\s*$')
FRAME_LOOKBACK_LINES = 12
"""How far above an exception line its innermost frame is looked for when other processes' output
broke the traceback apart (interleaved lines end a traceback early)."""


def _frame_above(lines: Sequence[str], index: int) -> str:
    for line in reversed(lines[max(0, index - FRAME_LOOKBACK_LINES) : index]):
        if _FRAME_LINE.match(strip_rank_prefix(line)):
            return line.strip()
    return ""


# ---- signals a launcher or shell wrote into the log (see dlrover.diagnosis.logsignals) ------


def _log_signal(*signums: int) -> Callable[[Evidence], Sequence[str]]:
    def match(evidence: Evidence) -> Sequence[str]:
        if evidence.exit is not None and evidence.exit.signal is not None:
            return ()  # the agent's own exit status says how it ended (the *-exit rules)
        found = signal_in_log(evidence)
        if found is None or found.signal not in signums:
            return ()
        return [found.line]

    return match


def _unless_no_oom_kill(match: Callable[[Evidence], Sequence[str]]) -> Callable[[Evidence], Sequence[str]]:
    """`match`, except where the agent read its OOM records and they show no kill (`NO_OOM_KILL`)."""

    def checked(evidence: Evidence) -> Sequence[str]:
        return () if _has_line_starting(evidence, NO_OOM_KILL) else match(evidence)

    return checked


# ---- collectives that timed out in different operations on different ranks ------------------

_WORK = re.compile(
    r"(?:PG ID (?P<pg>\d+).*)?Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
    r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d+))?"
)
_WORK_SCANNER = (Scanner.of(_WORK),)


def _desynchronized_collectives(evidence: Evidence) -> Sequence[str]:
    """Ranks whose watchdogs timed out the same collective sequence number in different
    operations or sizes: they called different collectives, so each waits for a partner that
    never comes (a program that desynchronized its ranks: a hang, not a slow network)."""
    lines = evidence.lines()
    seen: dict[tuple[str, str], tuple[str, str, str]] = {}
    hits: list[str] = []
    for index in matching_lines(evidence, _WORK_SCANNER):
        m = _WORK.search(lines[index])
        if m is None:
            continue
        key = (m.group("pg") or "", m.group("seq"))
        what = (m.group("op"), m.group("numel") or "", lines[index])
        first = seen.setdefault(key, what)
        if first[:2] != what[:2] and (first[0] != what[0] or (first[1] and what[1])):
            hits += [first[2], lines[index]]
    return hits


def builtin_rules() -> tuple[Rule, ...]:
    """A fresh tuple of the rules DLRover ships with (new objects on every call).

    Confidences order the kinds: a clear device fault or OOM outranks the communication errors
    that follow it on other ranks; a message that names its cause outranks a bare exception class;
    a plain SIGKILL (killed, cause unseen) is weak evidence.
    """
    k = FailureKind
    return (
        # -- device memory
        LogPatternRule(
            "cuda-oom",
            k.DEVICE_OOM,
            0.95,
            [
                r"CUDA out of memory",
                r"CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY",
                r"\bOutOfMemoryError\b",
                r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
                r"(HIP|MPS backend|XPU|NPU) out of memory",
                r"cudaErrorMemoryAllocation",
                r"Cuda failure (\d+ )?.?out of memory",
                r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
                r"\bOOM when allocating tensor",
                # Other accelerators' allocators and CUDA libraries that allocate device memory.
                r"RESOURCE_EXHAUSTED:.{0,40}\b(Failed to allocate|Ran out of memory|Attempting to reserve)",
                # TPU runtimes of an older XLA, naming the device memory (HBM) that ran out.
                r"Resource exhausted: Attempting to allocate \S+\. That was not possible.*HBM",
                r"Ran out of memory in memory space (hbm|vmem)|Exceeded hbm capacity",
                r"hipErrorOutOfMemory|hipErrorMemoryAllocation|OUT_OF_DEVICE_MEMORY",
                r"\b(CUDNN|CUSOLVER|CUSPARSE|CUBLAS)_STATUS_ALLOC_FAILED|\bCUFFT_ALLOC_FAILED",
                r"Failed to CUDA (calloc|malloc|host alloc)|\bcuMem\w* failed.{0,40}out of memory",
                # MPS's allocation limit; Ascend's allocator (CANN error EL0004).
                r"Invalid buffer size: [\d.]+ ?[KMGT]i?B|\bEL0004\b",
            ],
            # The JVM's heap (a data loader's Spark or Java tokenizer), Ray's memory monitor and a
            # container runtime's memory limit name host memory.
            unless=[
                r"java\.lang\.OutOfMemoryError|running low on memory|memory usage threshold",
                r"Container killed due to memory usage",
            ],
        ),
        # -- host memory
        LogPatternRule(
            "kernel-oom-killer",
            k.HOST_OOM,
            0.92,
            [
                r"Out of memory: Kill(ed)? process",
                r"invoked oom-killer",
                r"\boom-kill\b",
                r"oom_reaper",
                r"Memory cgroup out of memory",
                r"\bOOM[ -]?Killed\b",
                r"\boom[_-]kill events?\b",
                r"task \d+: Out Of Memory",
                r"\bOUT_OF_MEMORY\b",
                r"exceeded (job |step )?(virtual )?memory limit|Exceeded (job|step) memory limit",
                # PBS, LSF, AWS Batch, the kubelet's SystemOOM event, systemd-oomd and earlyoom.
                r"job killed: v?mem \S+ exceeded limit|\bTERM_MEMLIMIT\b",
                r"Container killed due to memory usage",
                r"System OOM encountered|\bSystemOOM\b|\bOOMKilling\b",
                r"\bKilled \S+ due to memory (pressure|used)\b|systemd-oomd.*\bKilled\b",
                r"earlyoom: (sending SIG(TERM|KILL)|low memory)",
                # A notebook host (Colab, Kaggle) restarting the kernel for memory.
                r"after using all available RAM|used all available RAM",
                r"std::bad_alloc",
                # Rust's allocator gave up (tokenizers, polars, safetensors are Rust) and aborted.
                r"\bmemory allocation of \d+ bytes failed",
                r"Cannot allocate memory",
                r"DefaultCPUAllocator: (not enough memory|can't allocate memory)",
                r"Unable to allocate [\d.]+ [KMGTP]i?B for an array",
                r"java\.lang\.OutOfMemoryError|Java heap space",
                r"low on resource: memory",
                r"\bMemoryPressure\b",
                r"node running low on memory|exceeds the memory usage threshold",
                # Ray's raylet, whose memory monitor kills workers before the kernel does.
                r"Workers? \(tasks / actors\) killed due to memory pressure",
                r"paging file is too small",
            ],
        ),
        # TensorFlow's stream executor could not take the device memory it asked for (another
        # process holds it, or the model does not fit); it may go on with less, so below the rest.
        LogPatternRule(
            "device-allocation-failed",
            k.DEVICE_OOM,
            0.8,
            [
                r"failed to allocate [\d.]+\s?[KMGT]?i?B? \(\d+ bytes\) from device",
                r"\bran out of memory trying to allocate",
                # "out of memory" said of a device rather than of the host.
                r"\b(GPU|VRAM|accelerator|TPU|HBM)\b.{0,30}\bout of memory\b",
                r"\bout of memory\b.{0,30}\bon (GPU|device)\b",
            ],
            # TensorFlow's allocator warns so when it goes on with less memory.
            unless=[r"not a failure", r"cgroup|Killed process|oom-kill|host memory"],
        ),
        # The agent's reading of the kernel's own records (`dlrover.diagnosis.OomWatch`): the
        # evidence that tells an OOM kill from a plain SIGKILL.
        LogPatternRule(
            "host-memory-record",
            k.HOST_OOM,
            0.93,
            [r"^" + re.escape(MEMORY_RECORD) + r": (?!" + re.escape(NO_OOM_KILL[len(MEMORY_RECORD) + 2 :]) + ")"],
        ),
        ExceptionRule("python-memory-error", k.HOST_OOM, 0.9, {"MemoryError", "_ArrayMemoryError"}),
        LogPatternRule(
            "dataloader-worker-killed",
            k.HOST_OOM,
            0.85,
            [r"DataLoader worker \(pid.*\) is killed by signal: Killed"],
        ),
        FunctionRule("sigkill-with-full-memory", k.HOST_OOM, 0.85, _killed_with_full_memory),
        # -- hardware and node faults
        LogPatternRule(
            "gpu-hardware-fault",
            k.HARDWARE,
            0.96,
            [
                r"uncorrectable ECC error",
                r"\bECC errors?\b.*(detected|encountered|uncorrectable|double.bit)",
                r"double.bit ECC|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE",
                r"GPU is lost|GPU_IS_LOST\b",
                r"fallen off the bus",
                r"Unable to determine the device handle for GPU",
                r"RmInitAdapter failed",
                r"uncorrectable NVLink error",
                r"NVLink.*(fatal|error|down|inactive)",
                r"pending (page )?retirement|row remapping failure",
                r"GPU requires (a )?reset|requires a GPU reset",
                r"\[Hardware Error\]|Machine check events? logged|\bUE memory (read |write )?error",
                r"PCIe Bus Error: severity=Uncorrected|Uncorrected \(Fatal\) error",
                # The Kubernetes device plugin or DCGM took the GPU out of service.
                r"Critical Xid|XidCriticalError|(mark(ed|ing)|report(ed|ing)) (the )?(device|gpu)\S* .*unhealthy",
                r"\bunhealthy (gpu|device)s?\b|\b(gpu|device)s? (is |are )?unhealthy\b",
                # DCGM's health-check failures that stay with the GPU.
                r"\bDCGM_FR_(VOLATILE_DBE_DETECTED|ROW_REMAP_FAILURE|PENDING_PAGE_RETIREMENTS|FALLEN_OFF_BUS"
                r"|NVLINK_DOWN|RETIRED_PAGES_LIMIT|UNCONTAINED_ERROR|PCIE_REPLAY_THRESHOLD_VIOLATION)\b",
            ],
        ),
        FunctionRule("nvidia-xid-hardware", k.HARDWARE, 0.95, _hardware_xid),
        LogPatternRule(
            "cuda-device-unusable",
            k.HARDWARE,
            0.85,
            [
                r"CUDA error: unknown error",
                # cudaErrorUnknown (999) from the first CUDA call (cudaGetDeviceCount): the driver
                # is in a state a process cannot clear (its kernel modules need a reload).
                r"\bError 999: unknown error",
                r"cudaErrorUnknown",
                r"busy or unavailable",
                r"CUDA driver initialization failed",
                r"(device|GPU) residue|still (holds|holding|occupies|occupied)\b.*GPU|leftover process.*GPU",
                r"NVML.*(Unknown Error|GPU is lost)",
                r"^No devices were found",
                r"Cuda failure '?unknown error",
                # nvidia-smi's table for a GPU it cannot read.
                r"\|\s+ERR!\s",
                # A driver updated under a running node: the node needs a reboot.
                r"Driver/library version mismatch",
                # NVSwitch systems whose fabric manager is down: no GPU of the node can be used.
                r"system not yet initialized|cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY",
                r"couldn't communicate with the NVIDIA driver",
                # ROCm's runtime and the amdgpu driver: a GPU that hung or had to be reset.
                r"HW Exception by GPU node|reason\s*:\s*GPU Hang",
                r"amdgpu\b.*\b(GPU reset|ring \S+ timeout)\b",
            ],
        ),
        # The host channel adapter reports a fault of its own (not a peer's): the node's network.
        LogPatternRule(
            "network-adapter-fault",
            k.HARDWARE,
            0.8,
            [
                r"Got async event\s*:\s*(local catastrophic error|port error|device fatal)",
                r"Got async event\s*:\s*local work queue catastrophic",
                r"health compromised|mlx5_core.*\b(fatal error|internal error|syndrome)\b",
            ],
        ),
        FunctionRule("health-probe-failed", k.HARDWARE, 0.8, _failed_probe),
        # Above the communication rules: the probes' own errors (gloo timeouts) are in this log.
        LogPatternRule("node-check-failed", k.HARDWARE, 0.97, [re.escape(NODE_CHECK_FAILED)]),
        # -- user code: a class alone is weaker than a message that names a cause
        ExceptionRule("user-exception", k.USER_CODE, 0.87, _USER_EXCEPTIONS),
        ExceptionRule("user-runtime-error", k.USER_CODE, 0.88, (), "|".join(_USER_RUNTIME_MESSAGES)),
        LogPatternRule(
            "user-launch-error",
            k.USER_CODE,
            0.88,
            [
                r"can't open file .*No such file or directory",
                # The import's own line, when a prefix the launcher glued to it ("[stderr]") hides
                # the traceback around it: at the start of a line only, not a warning that quotes it.
                r"^(?:\[[^\]]*\]\s*)*ModuleNotFoundError: No module named '",
                r"device-side assert triggered",
                r"Failed to import \S+ because of the following error",
                r": command not found$",
                # torch >= 2.0's launcher passes --local-rank=N (it passed --local_rank before): a
                # script whose argparse does not accept it fails on every start until it reads
                # LOCAL_RANK from the environment or accepts the new spelling.
                _LOCAL_RANK_ARGUMENT,
                r"Error building extension|ninja: build stopped: subcommand failed|nvcc fatal\s*:",
                # A library too old or too new for the files or the script (tokenizers, torch.load).
                r"data did not match any variant of untagged enum",
                r"Weights only load failed",
                r"no kernel image is available for execution on the device",
                # The device-side assert's own line (a label out of range, an index past the end).
                r"block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion .* failed",
                # torch.compile could not compile the program.
                r"\bBackendCompilerFailed\b|torch\._dynamo\.exc\.(Unsupported|UserError|TorchRuntimeError)\b",
            ],
        ),
        FunctionRule("user-frame-exception", k.USER_CODE, 0.8, _raised_in_user_code),
        FunctionRule("user-exception-weak", k.USER_CODE, 0.6, _weak_user_exception),
        # -- launch configuration: above user code (the launcher's own exceptions) and above the
        # communication rules (a port in use is not a flaky network).
        LogPatternRule(
            "launch-config",
            k.CONFIG_ERROR,
            0.93,
            [
                r"Address already in use",
                r"\bEADDRINUSE\b",
                r"invalid device ordinal",
                r"no socket interface found",
                r"Socket creation failed",
                r"Cannot assign requested address",
                r"\bncclInvalidUsage\b|\binvalid usage\b.*\bNCCL\b|\bNCCL\b.*\binvalid usage\b",
                r"Duplicate GPU detected",
                r"NCCL_SOCKET_IFNAME.*(not found|no interface|invalid)",
                r"You need to run .?accelerate config",
                r"CUDA_VISIBLE_DEVICES.*(invalid|out of range)",
                # The launcher's environment contract, or the command line, is not met.
                r"environment variable \w+ expected, but not set",
                r"KeyError: '(LOCAL_RANK|RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'",
                r"error: unrecognized arguments|error: the following arguments are required",
                r"error: argument \S+: (invalid|expected)",
                r"Invalid rendezvous configuration",
                # Configuration files: Hydra/OmegaConf, DeepSpeed's batch arithmetic.
                r"\b(ConfigAttributeError|ConfigKeyError|MissingMandatoryValue|ConfigCompositionException)\b",
                r"Key '[^']+' is not in struct|Missing mandatory value",
                r"Check batch related parameters",
                r"failed to listen on any local network address",
                r"No interface found in the same subnet",
                r"Distributed package doesn't have \w+ built in",
                r"CUDA_HOME environment variable is not set",
                # accelerate refuses P2P/IB on GPUs without it and names the NCCL setting to change.
                r"doesn't support faster communication broadband via P2P or IB",
                r"mixed precision requires a GPU|\bDeepSpeedConfigError\b|not used by the HfArgumentParser",
                r"\byaml\.(scanner|parser|constructor|composer)\.\w*Error\b",
                # A port in use by errno; gloo's GLOO_SOCKET_IFNAME; a host without IPv6.
                r"\berrno:? 98\b",
                r"Unable to find address for:? \S+",
                r"Address family not supported by protocol",
                r"\bInvalid device id\b",
                # A container that cannot be started; a Slurm request that cannot be met. (An image
                # that cannot be pulled: the rule below.)
                r"\b(InvalidImageName|CreateContainerConfigError)\b",
                r"Requested node configuration is not available|More processors requested than permitted",
                r"Batch job submission failed|Invalid generic resource",
                r"Invalid (account|partition name|qos specification)",
                # A precision or kernel the node's GPUs do not support.
                r"doesn't support bf16|Bfloat16 is only supported on GPUs|only supports Ampere GPUs or newer",
                # A model name or path that resolves to nothing, or a gated model without a token.
                r"is not a local folder and is not a valid model identifier|Repository Not Found for url",
                r"\bGatedRepoError\b|access to model .* is restricted|trying to access a gated repo",
            ],
            # c10d's warnings while it tries the addresses of a host in turn (IPv6 first): the
            # launch goes on; a port really in use ends in the error above. A script that does not
            # accept the launcher's own --local-rank argument is the script's to fix (user code).
            unless=[r"\[W[\d :.]*\w+\.(cpp|cc|h)[:\]]", _LOCAL_RANK_ARGUMENT],
        ),
        # An image the node cannot pull: a wrong name, tag or credential, usually; below disk-full,
        # for a node whose disk is full fails the pull too (often said on another line of the events).
        LogPatternRule("image-pull-failed", k.CONFIG_ERROR, 0.85, [r"\b(ErrImagePull|ImagePullBackOff)\b"]),
        # A node without usable GPUs: usually the launch settings (visible devices, the
        # container's GPUs); weaker than a hardware fault in the same log.
        LogPatternRule(
            "launch-config-likely",
            k.CONFIG_ERROR,
            0.8,
            [
                r"No CUDA GPUs are available",
                r"no CUDA-capable device is detected",
                r"Found no NVIDIA driver on your system",
                r"is only supported with GPUs, no GPUs found",
                r"device >= 0 && device < num_gpus",
                # The node's driver or the process's limits, not the script.
                r"driver on your system is too old|CUDA driver version is insufficient for CUDA runtime version",
                r"PTX was compiled with an unsupported toolchain",
                r"Too many open files|received 0 items of ancdata",
            ],
        ),
        # /dev/shm full: its size is a container setting (Docker's 64 MB default, a pod without a
        # memory-backed /dev/shm), not the host's memory and not a data disk; above both.
        LogPatternRule(
            "shared-memory-too-small",
            k.CONFIG_ERROR,
            0.94,
            [
                r"insufficient shared memory \(shm\)|out of shared memory|raise your shared memory limit",
                r"DataLoader worker \(pid.*\) is killed by signal: Bus error",
                r"Error while creating shared memory segment|failed to extend /dev/shm",
                # A pattern for log text, not a path this code opens.
                r"/dev/shm\S*.*(No space left on device|too small)|posix_fallocate failed: No space left",  # noqa: S108
                # torch's shared-memory files ("</torch_4242_1954506624>") live in /dev/shm.
                r"</torch_\d+_\d+(_\d+)?>.*No space left on device",
            ],
        ),
        FunctionRule("launcher-rejected-config", k.CONFIG_ERROR, 0.92, _launcher_rejected_config),
        FunctionRule("settings-rejected", k.CONFIG_ERROR, 0.9, _settings_rejected),
        FunctionRule("duplicate-ranks", k.CONFIG_ERROR, 0.85, _duplicate_ranks),
        # Sizes that must divide each other (a parallel layout and the GPU count, a batch and
        # the data-parallel size, an embedding and its heads) do not: a setting to change, above
        # the assertion or ValueError it is raised as.
        ExceptionRule(
            "indivisible-sizes",
            k.CONFIG_ERROR,
            0.89,
            {"AssertionError", "ValueError"},
            r"\b(should|must|has to|needs to) be (evenly )?divisible by\b|\bis not (evenly )?divisible by\b",
        ),
        # A dataset that yields no samples at all: its path or filter in the settings is wrong.
        ExceptionRule("empty-dataset", k.CONFIG_ERROR, 0.89, {"ValueError"}, r"\bnum_samples=0\b"),
        # A path in the settings that points nowhere: restarting finds the same nothing.
        ExceptionRule("missing-file", k.CONFIG_ERROR, 0.7, {"FileNotFoundError"}),
        FunctionRule("store-refused-at-init", k.CONFIG_ERROR, 0.8, _refused_at_init),
        # -- full disks and quotas: the data is fine, the directory is full
        LogPatternRule(
            "disk-full",
            k.DISK_FULL,
            0.9,
            [
                r"No space left on device",
                r"Disk quota exceeded",
                r"\bE(NOSPC|DQUOT)\b",
                r"\[Errno (28|122)\]",
                r"os error (28|122)\b",
                r"\bStorageFull\b",
                r"PytorchStreamWriter failed writing",
                # torch.save's zip writer finds fewer bytes on disk than it wrote.
                r"unexpected pos \d+ vs \d+",
                r"\bDiskPressure\b",
                r"low on resource: (ephemeral-storage|nodefs|imagefs)|ephemeral local storage usage exceeds",
                r"not enough (free )?(disk )?space",
                r"insufficient (free )?(disk|storage) space|\bran out of (disk|storage) space\b",
                r"\b(error|fatal)\W+out of (disk|storage) space\b",
                r"database or disk is full|(file ?system|disk) (is )?full\b",
                # HDFS's quotas; a pod's ephemeral storage and emptyDir limits (the kubelet evicts).
                r"\bDSQuotaExceededException\b|DiskSpace quota of .* is exceeded",
                r"exceeded its local ephemeral storage limit|Usage of EmptyDir volume .* exceeds the limit",
                r"\b(storage|disk|space|inode|file) quota (has been |was )?exceeded",
                r"exceeded (the |your )?(storage|disk|inode) quota",
            ],
        ),
        # A checkpoint writer that cannot open its file: the directory is full or not writable.
        # torch's serializer reports a write(2) that failed with the errno's words ("write(): fd 29
        # failed with Input/output error"): network and FUSE file systems return EIO for a write
        # their server refused for space or quota (ENOSPC itself is the rule above).
        LogPatternRule(
            "checkpoint-write-failed",
            k.DISK_FULL,
            0.6,
            [r"File \S+ cannot be opened", r"\bwrite\(\): fd \d+ failed with"],
        ),
        # -- data and storage
        LogPatternRule(
            "corrupt-checkpoint",
            k.DATA_ERROR,
            0.9,
            [
                r"PytorchStreamReader failed",
                r"failed finding central directory",
                r"invalid load key",
                r"pickle data was truncated",
                r"Ran out of input",
                r"unexpected EOF, expected \d+ more bytes",
                r"not a zip file|BadZipFile",
                r"MetadataIncompleteBuffer|InvalidHeaderDeserialization",
                r"file signature not found",
                r"Compressed file ended before the end-of-stream marker",
                r"not a gzip(ped)? file",
                r"ReadError: (unexpected end of data|file could not be opened successfully|empty file)",
                r"Unable to load weights from pytorch checkpoint file",
                # A file shorter than its header says: numpy memmaps, torch storages, msgpack.
                r"mmap length is greater than file size|storage has wrong (byte )?size",
                r"Unpack failed: incomplete input",
                # HDF5's and LMDB's words for a file whose structure is broken.
                r"bad object header|bad symbol table|wrong B-tree signature|address of object past end of allocation",
                r"incorrect metadata checksum|\bMDB_(INVALID|CORRUPTED|PAGE_NOTFOUND)\b|not an LMDB file",
                # Model files that are Git LFS pointers because git-lfs was missing at clone time.
                r"cloned a repository without having git-lfs installed",
            ],
        ),
        ExceptionRule("truncated-input", k.DATA_ERROR, 0.75, {"EOFError"}),
        # HF datasets could not build a dataset from its files (its cause, when printed, is above).
        ExceptionRule("dataset-generation-failed", k.DATA_ERROR, 0.7, {"DatasetGenerationError"}),
        LogPatternRule(
            "data-or-storage",
            k.DATA_ERROR,
            0.86,
            [
                r"Read-only file system",
                r"Stale file handle",
                r"corrupt(ed|ion)?\b|\bcorrupt",
                r"\btruncated\b",
                r"UnicodeDecodeError",
                r"JSONDecodeError",
                r"UnidentifiedImageError|cannot identify image file|broken data stream",
                r"Error -3 while decompressing|invalid (stored block lengths|distance too far|block type)",
                r"CRC (check )?(failed|mismatch|error)|checksum mismatch",
                r"NonMatchingChecksumError|Checksums didn't match",
                r"magic bytes not found|ArrowInvalid|Not a valid (TFRecord|parquet)",
                r"SafetensorError|HeaderTooLarge",
                r"DataLossError",
                r"\[Errno 5\] Input/output error",
                r"Invalid data found when processing input|moov atom not found|Format not recognised",
                r"ParseFromArray|DecodeError: Error parsing message",
                r"Error tokenizing data",
                # An image reader that got nothing back: the file is missing or undecodable.
                r"!_src\.empty\(\)",
                r"Can't (synchronously )?read data|Failed to interpret file .* as a pickle",
                # serde_json (tokenizers, safetensors' headers) and datasets' schema casts.
                r"expected value at line \d+ column \d+|CastError: Couldn't cast",
                # A Git LFS pointer checked out in place of the file it stands for.
                r"version https://git-lfs",
                # csv's NUL bytes, pandas' JSON reader, tensorstore (orbax checkpoints).
                r"line contains NUL|field larger than field limit|Expected object or value",
                r"\bDATA_LOSS\b|\bunexpected end of (file|stream|archive)\b",
                # Images a decoder refused; a download shorter than its size; a TF Example.
                r"Not a JPEG file|Invalid (PNG|JPEG|GIF|BMP) data|DecompressionBombError",
                r"Consistency check failed: file should be of size|Can't parse serialized Example",
            ],
            unless=[
                # glibc heap corruption is a native crash, not bad data.
                r"malloc|free\(\)|double free|size vs\.? prev_size|heap|corrupted (top|double-linked)",
                # The collective layer warns that data "might be corrupted" after a timeout.
                r"NCCL|ProcessGroup|Watchdog|\bgloo\b|MPI_ERR|message truncated",
                r"corrupted/incomplete data|might run on corrupted",
                # Tokenizers and text encoders shorten over-long inputs and say so.
                r"truncated because|will be truncated|truncated to (a )?(max|\d)",
                r"(inputs?|sequences?|texts?|tokens?|prompts?) (is|are|was|were|gets?) truncated",
                # Warnings about inputs the reader recovered from or skipped: training went on.
                r"extraneous bytes before marker|Premature end of JPEG|skip\w* .{0,30}corrupt|corrupt.{0,40}skip",
                r"\bwarn(ings?)?\b",
                # A shell script cut short ("syntax error: unexpected end of file").
                r"syntax error",
            ],
        ),
        # -- numerics
        FunctionRule("non-finite-loss-values", k.NAN_LOSS, 0.95, _non_finite_loss),
        LogPatternRule(
            "nan-loss-in-log",
            k.NAN_LOSS,
            0.9,
            [
                # "loss: nan", "'loss': nan", "lm loss: nan", "val_loss = nan", "loss (avg) inf".
                r"loss(?![ _]?scal)\w*['\"]?\s*(\([^)]{0,20}\)\s*)?([:=]|\bis\b|\bwas\b)?\s*['\"]?"
                r"(tensor\(\[?|\[)?[-+]?(nan|inf|infinity)\b",
                r"\bloss (is|became|has become|becomes|goes to|went to|went|turned( into)?|turns( into)?) "
                r"(nan|inf|infinite|non-finite|not finite)",
                # Lightning: "The loss returned in `training_step` is nan."
                r"\bloss\b[^.:;,]{0,40}\bis (nan|inf|infinite|non-finite|not finite)\b",
                r"\b(non-?finite|infinite or nan|nan or inf(inite)?) loss\b|\bloss (has )?(diverged|exploded)\b",
                # Two patterns: the parser would factor the alternatives' common "n" out of one
                # group, leaving no anchor but "grad", which every progress line holds.
                r"\b(grad(ient)?[ _]?norm|gradients?) (is|are|was|were|became|has become) nan\b",
                r"\b(grad(ient)?[ _]?norm|gradients?) (is|are|was|were|became|has become) (non-finite|not finite)\b",
                # TensorFlow's check_numerics, Paddle's FLAGS_check_nan_inf.
                r"Tensor had (NaN|Inf) values|\bnum_(nan|inf)=[1-9]",
                r"\b(ppl|perplexity)\b['\"]?\s*[:=]\s*['\"]?nan\b",
                r"(nan|non-finite|infinite) (loss|gradients?|grad norm) (detected|encountered)",
                r"\b(nan|inf)s? (values? )?(detected|encountered|found) in (the )?(loss|grad)",
                r"\bnan loss\b|NanLossDuringTrainingError|Invalid loss, terminating training",
                r"\bfound (nan|inf)\b",
                r"\bis non-finite\b|\bis not finite\b",
                r"\b(nan|inf) ?(or|and|/|and/or) ?(nan|inf)\b.{0,40}\b(loss|gradients?|values|found|detected|input)",
                r"number of nan iterations:\s*[1-9]",
                r"returned nan values in its \d+\w* output",
                r"contains (either )?\W?(inf|nan)\b|Input contains (NaN|infinity)",
                r"tensor\(\[+\s*nan\b",
                r"Minimum loss scale reached",
                r"loss scale already at minimum",
                # NaN only: a mixed-precision trainer logs an infinite norm for the steps its
                # scaler skips, and goes on.
                r"(\bgrad(ient)?[ _]?norm|\bgnorm|_grad_norm)\b[^,;|]{0,8}?[:=]\s*['\"]?[-+]?nan\b",
                # A table of metrics per step whose first value is NaN (``2000  [nan]  [nan]``).
                r"^\s*\d+\s+\[?\s*nan\s*\]?\s",
            ],
            unless=[
                r"loss scale(r)? (to|reducing)|reducing loss scale|Gradient overflow",
                # The starting value of a best-so-far tracker, not a loss.
                r"(best|min|lowest)\w*[ _](val\w*[ _])?loss\w*['\"]?\s*[:=]?\s*[-+]?inf\b",
                r"improved from inf\b",
                # A check that found nothing, or a setting that turns a check on.
                r"\bno (nan|inf)s?\b|terminate_on_nan|detect_anomaly",
            ],
        ),
        ExceptionRule("floating-point-error", k.NAN_LOSS, 0.88, {"FloatingPointError"}),
        FunctionRule("falling-loss-scale", k.NAN_LOSS, 0.7, _falling_loss_scale),
        FunctionRule("collapsed-loss-scale", k.NAN_LOSS, 0.75, _collapsed_loss_scale),
        FunctionRule("loss-scale-at-floor", k.NAN_LOSS, 0.85, _loss_scale_at_floor),
        FunctionRule("nan-loss-columns", k.NAN_LOSS, 0.8, _nan_loss_columns),
        # -- hangs (from the detector, or as the collective layer reports them)
        FunctionRule("hang-detector", k.HANG, 0.9, _hang_reported),
        # Ranks in different collectives: each waits for a partner that never comes. Above the
        # collective timeouts, which are how such a deadlock ends.
        LogPatternRule(
            "collective-mismatch",
            k.HANG,
            0.85,
            [
                r"Detected mismatch between collectives",
                r"\bcollective mismatch\b|mismatched collectives?",
                r"is running collective: CollectiveFingerPrint.*but Rank \d+ is running collective",
            ],
        ),
        FunctionRule("desynchronized-collectives", k.HANG, 0.8, _desynchronized_collectives),
        # torch's desync report (TORCH_NCCL_DESYNC_DEBUG=1): after a collective timed out, the
        # watchdog compares the ranks' progress and names the ranks that never joined the
        # collective the others wait in: a stuck or desynchronized rank, not a network that lost
        # data. Above the collective timeouts it follows; below a crash, an OOM or a stop from
        # outside, which leave a dead rank behind that the report names too.
        LogPatternRule(
            "desync-report",
            k.HANG,
            0.78,
            [
                r"lagging/dead/mismatched ranks that caused the desync",
                r"\bdidn't join collective #\d+",
                # monitored_barrier (a barrier for debugging hangs) names the ranks that never
                # reached it within its timeout.
                r"failed to pass monitoredBarrier",
            ],
        ),
        FunctionRule("blocked-process", k.HANG, 0.65, _blocked_process),
        # The kernel's hung-task watchdog: a process stuck in uninterruptible sleep (storage, driver).
        LogPatternRule("hung-task", k.HANG, 0.7, [r"blocked for more than \d+ seconds", r"hung_task_timeout_secs"]),
        # A process that dumped its own stacks because a deadline passed (faulthandler's
        # dump_traceback_later), Horovod's stall inspector, a DataLoader whose workers stopped.
        LogPatternRule(
            "stalled-progress",
            k.HANG,
            0.72,
            [
                r"^\W*Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!\s*$",
                r"waiting for remainder of ranks for more than \d+ seconds|\bStalled ranks:",
                r"DataLoader timed out after \d+ seconds",
            ],
        ),
        # Below the collective timeouts: a stuck watchdog alone says an API call hung; next to a
        # collective that timed out it is the timeout's aftermath.
        LogPatternRule(
            "watchdog-stuck",
            k.HANG,
            0.7,
            [r"watchdog got stuck for \d+ seconds without making progress", r"Heartbeat monitor timed out"],
        ),
        # -- communication
        LogPatternRule(
            "collective-failure",
            k.COMMUNICATION,
            0.75,
            [
                r"Watchdog caught collective operation timeout",
                r"collective operation timeout",
                r"NCCL communicator was aborted",
                r"\bNCCL error\b",
                r"nccl(System|Remote|Internal)Error",
                r"\bDist(Network|Backend|Store)Error\b",
                r"\bRendezvous(Timeout|Closed|Connection)Error\b",
                r"Connection reset\s+by\s+peer",
                r"Connection closed\s+by\s+(remote )?peer",
                # NCCL's socket transport: a system call on a peer's socket failed, its proxy thread
                # gave up (Markdown may have bolded the call's name).
                r"NCCL WARN (Net\s*:\s*)?Call to \W*\w+\W* (from \S+ )?failed|\[Proxy thread error\]",
                r"NET/Socket\s*:\s*socket progress error",
                r"unhandled system error",
                r"NET/IB\s*:\s*Got completion (from peer .* )?with (status|error)",
                # AWS EFA's NCCL plugin, MPI, Horovod and JAX's coordination service.
                r"WARN NET/OFI\b.*\b(error|failed)\b",
                r"\bMPI_ERR_[A-Z]+\b|An error occurred in MPI_\w+",
                r"\bHorovodInternalError\b|Horovod has been shut down",
                r"DEADLINE_EXCEEDED.{0,40}\b(Barrier|heartbeat|coordination)|\bBarrier timed out\b",
                r"Coordination service agent in error status: (DEADLINE_EXCEEDED|UNAVAILABLE)",
                r"client socket has timed out",
                # InfiniBand and UCX transports in their own words.
                r"\bmlx5\w*:.*got completion with error|retry count(er)? exceeded",
                r"\bUCX\s+ERROR\b",
                r"\bIBV_WC_\w+_ERR\b|transport retry counter exceeded|Call to ibv_\w+ failed",
                r"\bgloo\b.*(timed out|timeout|connection|closed|reset)",
                r"Socket Timeout",
                r"monitoredBarrier",
                r"TCPStore.*(timed out|timeout|failed)",
                r"ProcessGroupNCCL.*(timeout|timed out|abort)",
                r"Timed out (waiting|initializing|after) .*(store|process group|rendezvous|peers?|clients)",
            ],
            # The watchdog's own heartbeat: a hung API call (see watchdog-stuck), not a collective;
            # a connection the client retries.
            unless=[r"watchdog got stuck for", r"\bretrying\b"],
        ),
        LogPatternRule(
            "network-glitch",
            k.COMMUNICATION,
            0.6,
            # A CUDA call inside NCCL failed: the CUDA error itself, printed beside it, decides.
            [
                r"Connection refused",
                r"Broken pipe",
                r"ncclUnhandledCudaError|unhandled cuda error",
                # A name that does not resolve yet: a Kubernetes service or pod gets its DNS record
                # only once it runs, so a worker that starts first fails to resolve the master.
                r"Name or service not known|nodename nor servname provided|getaddrinfo (failed|error)",
                r"Temporary failure in name resolution",
            ],
        ),
        # -- preemption: the job or its node was stopped from outside
        LogPatternRule(
            "sigterm-in-log",
            k.PREEMPTION,
            0.8,
            [
                r"(received|got|caught|handling) (signal )?SIGTERM|SIGTERM (received|caught)",
                # torchelastic's SignalException ("got signal: 15"), spaced or reworded in pasted logs.
                r"got sig(nal|val) ?: ?(15|1)\b",
                r"\bpre-?empt(ed|ion|ing)\b|\bPreemptionError\b",
                r"Received (Signals\.)?(SIGTERM|SIGHUP|15|1) death signal",
                r"spot (instance )?(interruption|termination)|interruption notice",
                r"maintenance event",
                r"\b(being|been|was) (drained|evicted|preempted)\b",
                r"termination is imminent|imminent (node )?shutdown|node (is )?shutting down",
                r"system is going down|Power key pressed",
                r"\bSIGHUP\b",
                r"DUE TO (TIME LIMIT|PREEMPTION|NODE FAIL|JOB REQUEUE)|\bNODE_FAIL\b",
                r"\bTERM_(PREEMPT|RUNLIMIT|REQUEUE_\w+)\b|job killed: walltime \d+ exceeded limit",
                r"Requeued job|requeu(e|ing) (the )?job|job (was |has been )?requeued",
                r"TaintManagerEviction|\bNodeNotReady\b|\bNodeLost\b|node \S+ (is )?not ready|Node is not ready",
                # Slurm's job record; Azure's scheduled events; EC2's instance action; spot capacity
                # taken back in other words; AWS Batch losing the host; Lightning's requeue.
                r"JobState=(TIMEOUT|NODE_FAIL|DEADLINE)\b",
                r"\"EventType\"\s*:\s*\"(Preempt|Terminate)\"",
                r"\"action\"\s*:\s*\"(terminate|stop|hibernate)\"\s*,\s*\"time\"",
                r"\bspot\b.{0,40}\b(was |were |been |is being |are being )(interrupted|reclaimed|terminated)\b",
                r"capacity (was |has been )?reclaimed",
                r"Host EC2 \(instance \S+\) terminated",
                r"auto-requeue|requeue signal",
                # Ray lost a node (terminated, preempted or unreachable): its actors died with it.
                r"has been marked dead because the detector has missed too many heartbeats|\bNodeDiedError\b",
                r"\bNodeShutdown\b",
                # Time limits in other schedulers' words: submitit's, a Kubernetes Job's deadline.
                r"Job has timed out\. Ran \d+ minutes out of requested|Job was active longer than specified deadline",
                # The terminal session of a job started by hand went away: its processes get SIGHUP.
                r"Connection to \S+ closed by remote host|client_loop: send disconnect",
                # HTCondor's job log: the execute node lost the job (it went away or restarted), so
                # the schedd puts it back in the queue to run elsewhere.
                r"Job reconnection failed|\brescheduling job\b",
            ],
            # torchrun prints this when it stops the surviving workers of a failed group.
            unless=[r"Sending process \d+ closing signal"],
        ),
        # Slurm cancelled the job or step with no reason given: someone outside it, or srun
        # ending a step after one of its tasks failed. Too weak to explain other errors.
        LogPatternRule(
            "scheduler-cancelled",
            k.PREEMPTION,
            0.4,
            [
                r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT",
                r"srun: Job step aborted",
                r"srun: forcing job termination",
                # LSF: killed by its owner or an administrator.
                r"\bTERM_(OWNER|ADMIN|FORCE_OWNER|FORCE_ADMIN)\b",
                # A workload manager (Determined, a cluster's job controller) asked it to stop.
                r"\bwas requested to (terminate|stop)\b",
            ],
        ),
        FunctionRule("sigterm-exit", k.PREEMPTION, 0.7, _exit_signal(_SIGTERM, _SIGHUP)),
        FunctionRule("sigterm-in-exit-report", k.PREEMPTION, 0.65, _log_signal(_SIGTERM, _SIGHUP)),
        # A SIGKILL the agent saw itself whose OOM records it read (`OomWatch`): they show no
        # kill, so someone (a person, a tool) may have killed it as well as an OOM killer the
        # records do not count.
        FunctionRule("sigkill-exit", k.KILLED, 0.5, _killed),
        # A SIGKILL with no OOM record read (none readable on the host, or an exit status known
        # from elsewhere): as with a SIGKILL known only from a launcher's words, below.
        FunctionRule("sigkill-exit-unrecorded", k.HOST_OOM, 0.45, _killed_unrecorded),
        # A SIGKILL known only from another launcher's or a shell's words ("Killed", "exitcode:
        # -9", "Exit Code: 137"): nobody read the host's records for it, and a training process
        # killed with no word of why was, far more often than not, killed by the OOM killer.
        FunctionRule("sigkill-in-exit-report", k.HOST_OOM, 0.45, _unless_no_oom_kill(_log_signal(_SIGKILL))),
        # -- native crashes: above the communication rules, whose errors on the other ranks
        # follow a crashed peer; below device OOM, hardware and user code, which explain a crash.
        LogPatternRule(
            "native-crash",
            k.NATIVE_CRASH,
            0.8,
            [
                r"Segmentation fault|segfault",
                r"Fatal Python error: (?!Aborted)",
                r"double free or corruption|double free detected|corrupted size vs",
                r"\b(malloc|free|realloc|malloc_consolidate|_int_malloc|_int_free)\(\): \w+",
                r"Trace/breakpoint trap",
                r"corrupted double-linked list|munmap_chunk\(\): invalid pointer|stack smashing detected",
                # tcmalloc's abort on a heap it finds corrupt.
                r"tcmalloc.{0,40}Attempt to free invalid pointer",
                r"\bSIG(SEGV|ILL|FPE)\b",
                r"Signals\.SIG(SEGV|ILL|FPE)",
                r"illegal memory access was encountered|CUDA_ERROR_ILLEGAL_ADDRESS|cudaErrorIllegalAddress",
                r"misaligned address|illegal instruction was encountered",
                r"Windows fatal exception: access violation|0xC0000005",
                # Windows' NTSTATUS as a signed exit code: access violation, stack buffer overrun,
                # stack overflow.
                r"exit code -1073741819\b|exit code -1073740791\b|exit code -1073741571\b|0xC0000409|0xC00000FD",
                # ROCm's words for an illegal memory access; glog's fatal check (XLA, TF, NCCL).
                r"Memory access fault by GPU node|hipErrorIllegalAddress",
                r"HSA_STATUS_ERROR_(MEMORY_APERTURE_VIOLATION|EXCEPTION)",
                r"\*\*\* Check failure stack trace: \*\*\*",
            ],
            # A library's guess at what might have happened (joblib's "could be caused by a
            # segmentation fault ... or by an excessive memory usage"), not a report.
            unless=[r"could be caused by a segmentation fault|may have been caused by a segmentation fault"],
        ),
        # A GPU kernel that failed without saying why: usually the kernel's own fault.
        LogPatternRule(
            "kernel-launch-failure",
            k.NATIVE_CRASH,
            0.72,
            [
                r"unspecified launch failure|cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED",
                r"CUBLAS_STATUS_EXECUTION_FAILED|CUDNN_STATUS_EXECUTION_FAILED",
            ],
        ),
        FunctionRule(
            "native-abort",
            k.NATIVE_CRASH,
            0.8,
            _unless_watchdog_abort(
                _log_patterns(
                    r"terminate called (after throwing|without an active exception)",
                    r"\bSIGABRT\b|Signals\.SIGABRT|Fatal Python error: Aborted",
                )
            ),
        ),
        # Weaker: also printed after a crash that another rule explains (an OOM abort).
        FunctionRule(
            "native-abort-weak",
            k.NATIVE_CRASH,
            0.55,
            # The shell's and glibc's own words, capitalised as they print them: "the communicator
            # was aborted" is a collective's sentence, not a process's death.
            _unless_watchdog_abort(
                _log_patterns(r"core dumped", r"(?-i:^\W*Aborted\b(?!!))", r"(?-i:^\W*Bus error\b)")
            ),
        ),
        FunctionRule(
            "native-crash-exit",
            k.NATIVE_CRASH,
            0.75,
            _unless_watchdog_abort(_exit_signal(_SIGSEGV, _SIGABRT, _SIGILL, _SIGFPE, _SIGBUS)),
        ),
        FunctionRule("crash-in-exit-report", k.NATIVE_CRASH, 0.75, _log_signal(_SIGSEGV, _SIGILL, _SIGFPE, _SIGBUS)),
        FunctionRule("abort-in-exit-report", k.NATIVE_CRASH, 0.55, _unless_watchdog_abort(_log_signal(_SIGABRT))),
    )
