"""The evidence the classifier decides from: plain, frozen values with no I/O.

Collectors (the log reader, the resource sampler, the detectors, the probes) produce these values;
the classifier only reads them. Times are monotonic seconds from the caller's `Clock`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative_finite, non_negative_int
from dlrover.diagnosis.exitinfo import ExitInfo
from dlrover.diagnosis.logtail import LogTail, TailConfig, fold_case, tail_from_bytes
from dlrover.diagnosis.tracebacks import PythonTraceback, extract_tracebacks

__all__ = [
    "DEFAULT_PHASE",
    "AnchoredExcuse",
    "Evidence",
    "GpuSample",
    "HangReport",
    "LossSample",
    "PeerExcuse",
    "ProbeResult",
    "ResourceSample",
    "StepReport",
]

T = TypeVar("T")

DEFAULT_PHASE = "train"
"""The phase of ordinary training steps; other phases (``checkpoint``, ``eval``, ``wait``) get their own allowance."""


def _finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"{attribute.name} must be a finite number, got {value!r}")


def _phase(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _at_least_one(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 1:
        raise ConfigError(f"{attribute.name} must be a finite number >= 1, got {value!r}")


@attrs.frozen
class StepReport:
    """A rank says: I have finished `step` and am now in `phase`.

    Attributes:
        rank: the global rank.
        step: the number of steps completed (monotone per rank).
        time_s: when the report was made, in the observer's monotonic seconds.
        phase: what the rank does next: ``"train"``, or a named phase such as ``"checkpoint"``,
            ``"eval"`` or ``"wait"`` that may legitimately take longer than a step.
        steps_per_mark: how many steps the rank's marks usually cover (1 when it marks every
            step; 100 when only its saves, every 100 steps, mark), from the count of marks its
            slot keeps: reports that come in batches (heartbeats) cannot tell.
    """

    rank: int = attrs.field(validator=non_negative_int)
    step: int = attrs.field(validator=non_negative_int)
    time_s: float = attrs.field(validator=_finite)
    phase: str = attrs.field(default=DEFAULT_PHASE, validator=_phase)
    steps_per_mark: float = attrs.field(default=1.0, validator=_at_least_one)


@attrs.frozen
class RankStepStats:
    """A rank's recent step progress, as an agent batches it to the master on a heartbeat.

    Attributes:
        rank: the global rank.
        steps: the steps it finished.
        samples: the samples it consumed in total.
        median_step_s: the median of its recent clean step durations; 0 while none is known.
        since_step_s: seconds since it finished its last step (or since it started, before that).
        phase: what it does now (``train``, ``checkpoint``, ``eval``, ``wait``).
        median_sync_lead_s: the median of its recent lead times: seconds from the start of a step
            to its first synchronization point (`StepReporter.synchronizing`); 0 while none is
            known. In a synchronous job the ranks' step times are equal, their leads are not.
        steps_per_mark: how many steps its marks usually cover (see `StepReport`).
        sync_group: the smallest global rank of the group it synchronizes with: leads compare
            within a group.
    """

    rank: int = attrs.field(validator=non_negative_int)
    steps: int = attrs.field(validator=non_negative_int)
    samples: int = attrs.field(validator=non_negative_int)
    median_step_s: float = attrs.field(validator=non_negative_finite)
    since_step_s: float = attrs.field(validator=non_negative_finite)
    phase: str = attrs.field(default=DEFAULT_PHASE, validator=_phase)
    median_sync_lead_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    steps_per_mark: float = attrs.field(default=1.0, validator=_at_least_one)
    sync_group: int = attrs.field(default=0, validator=non_negative_int)


PEER_EXCUSE_MAX_S = 7 * 24 * 3600.0
"""The longest a peer excuse may have lasted or may last (seconds): longer is nonsense, refused."""


def _excuse_span(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= PEER_EXCUSE_MAX_S
    ):
        raise ConfigError(f"{attribute.name} must be a number of seconds in [0, {PEER_EXCUSE_MAX_S:g}], got {value!r}")


@attrs.frozen
class PeerExcuse:
    """Why ranks elsewhere that wait on a collective are not hung: a rank of another node is in a named phase
    within its allowance (rank 0 evaluating alone while the others wait at the next barrier), or runs code its
    agent found busy. Times are relative to when it was read, as it crosses machines whose clocks differ.

    Attributes:
        began_s_ago: seconds since it began.
        remaining_s: seconds it lasts from now at the latest (its allowance's end).
        why: what it is, for logs ("rank 0 in phase 'eval'").
    """

    began_s_ago: float = attrs.field(validator=_excuse_span)
    remaining_s: float = attrs.field(validator=_excuse_span)
    why: str = ""

    @classmethod
    def within_bounds(cls, began_s_ago: float, remaining_s: float, why: str = "") -> PeerExcuse:
        """An excuse from times computed here, each held to [0, `PEER_EXCUSE_MAX_S`] (an allowance may be set
        longer than an excuse may last: it then lasts the longest it may)."""
        return cls(min(max(began_s_ago, 0.0), PEER_EXCUSE_MAX_S), min(max(remaining_s, 0.0), PEER_EXCUSE_MAX_S), why)

    def anchored(self, now: float) -> AnchoredExcuse:
        """This excuse, read at `now`, placed on that clock."""
        return AnchoredExcuse(now - self.began_s_ago, now + self.remaining_s, self.why)


@attrs.frozen
class AnchoredExcuse:
    """A `PeerExcuse` placed on one clock (`PeerExcuse.anchored`): when it began and when it ends there."""

    began_s: float
    until_s: float
    why: str = ""

    def lasts(self, now: float) -> bool:
        """Whether it has begun and not ended at `now`."""
        return self.began_s <= now < self.until_s

    def relative(self, now: float) -> PeerExcuse:
        """It again as a `PeerExcuse` read at `now`, to send on."""
        return PeerExcuse.within_bounds(now - self.began_s, self.until_s - now, self.why)


@attrs.frozen
class GpuSample:
    """One accelerator's state at sampling time."""

    index: int = attrs.field(validator=non_negative_int)
    memory_used_bytes: int = attrs.field(validator=non_negative_int)
    memory_total_bytes: int = attrs.field(validator=non_negative_int)
    utilization_percent: float = attrs.field(default=0.0, validator=non_negative_finite)


@attrs.frozen
class ResourceSample:
    """CPU, memory and (when available) GPU usage of a node or process at one time.

    Attributes:
        time_s: when it was taken, monotonic seconds.
        cpu_percent: CPU use of the sampled process tree (100 = one full core).
        rss_bytes: resident memory of the sampled process tree.
        host_memory_used_bytes: memory in use on the host.
        host_memory_total_bytes: the host's (or the container's) memory limit.
        gpus: one sample per visible GPU; empty when nvidia-ml-py is absent or there is no GPU.
    """

    time_s: float = attrs.field(validator=_finite)
    cpu_percent: float = attrs.field(validator=non_negative_finite)
    rss_bytes: int = attrs.field(validator=non_negative_int)
    host_memory_used_bytes: int = attrs.field(validator=non_negative_int)
    host_memory_total_bytes: int = attrs.field(validator=non_negative_int)
    gpus: tuple[GpuSample, ...] = ()

    @property
    def host_memory_fraction(self) -> float:
        """Used over total host memory, 0 when the total is unknown."""
        if self.host_memory_total_bytes <= 0:
            return 0.0
        return self.host_memory_used_bytes / self.host_memory_total_bytes


@attrs.frozen
class ProbeResult:
    """The outcome of one node health probe on one rank.

    Attributes:
        rank: the rank in the probe's process group.
        world_size: the probe group's size (2 for a pair).
        ok: True when every step completed and the all-gathered values were right.
        matmul_s: seconds for the local matrix multiplications.
        allreduce_s: seconds for the all-reduce rounds.
        allgather_s: seconds for the all-gather rounds.
        backend: ``"gloo"`` or ``"nccl"``.
        error: why the probe failed; empty when it succeeded.
        node_id: the node this rank ran on, when the caller knows it.
    """

    rank: int = attrs.field(validator=non_negative_int)
    world_size: int = attrs.field(validator=non_negative_int)
    ok: bool
    matmul_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    allreduce_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    allgather_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    backend: str = "gloo"
    error: str = ""
    node_id: str = ""

    @property
    def total_s(self) -> float:
        """The probe's whole measured time."""
        return self.matmul_s + self.allreduce_s + self.allgather_s


@attrs.frozen
class LossSample:
    """A training loss as a rank reported it (NaN and infinity allowed: that is the point)."""

    step: int = attrs.field(validator=non_negative_int)
    value: float = attrs.field(converter=float)
    rank: int = attrs.field(default=0, validator=non_negative_int)

    @property
    def finite(self) -> bool:
        """False for NaN and +/- infinity."""
        return math.isfinite(self.value)


@attrs.frozen
class HangReport:
    """What the hang detector concluded at one moment.

    Attributes:
        hung: True when at least one rank made no progress for longer than its window.
        stalled_ranks: the ranks that stopped advancing, ascending.
        stalled_for_s: per stalled rank, seconds since its last progress, in the same order.
        window_s: the window the longest-stalled rank was judged against.
        reason: one sentence saying why (or why not).
    """

    hung: bool
    stalled_ranks: tuple[int, ...]
    stalled_for_s: tuple[float, ...]
    window_s: float
    reason: str


def _text_of(evidence: Evidence) -> str:
    return "\n".join(evidence.log.lines) if evidence.log is not None else ""


def _folded_of(evidence: Evidence) -> str:
    return fold_case(evidence.text)


def _line_starts_of(evidence: Evidence) -> tuple[int, ...]:
    starts = [0]
    for line in evidence.lines()[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    return tuple(starts) if evidence.lines() else ()


def _tracebacks_of(evidence: Evidence) -> tuple[PythonTraceback, ...]:
    return extract_tracebacks(evidence.log.lines) if evidence.log is not None else ()


@attrs.frozen
class Evidence:
    """Everything known about one failure of one node (or one process).

    All fields are optional: the classifier answers `unknown` with a reason when there is not
    enough to go on, rather than guessing.

    Attributes:
        node_id: the node the evidence is about.
        exit: how the process ended, when it ended.
        log: the tail of its log.
        steps: step-progress reports.
        resources: resource samples, oldest first.
        probes: node health probe results.
        losses: recent loss values.
        hang: the hang detector's report, when it flagged a hang.
        tracebacks: exceptions found in `log` (computed from it unless given).
        text: the log lines joined with newlines (computed).
        line_starts: the offset of each line in `text` (computed).
        folded_text: `text` lower-cased for case-insensitive scanning, empty when lower-casing
            would move characters (computed).
    """

    node_id: str = ""
    exit: ExitInfo | None = None
    log: LogTail | None = None
    steps: tuple[StepReport, ...] = ()
    resources: tuple[ResourceSample, ...] = ()
    probes: tuple[ProbeResult, ...] = ()
    losses: tuple[LossSample, ...] = ()
    hang: HangReport | None = None
    tracebacks: tuple[PythonTraceback, ...] = attrs.field(default=attrs.Factory(_tracebacks_of, takes_self=True))
    # The log lines joined by newlines, and where each line starts in it: rules scan the whole
    # text once per pattern (fast) instead of calling the regex engine once per line.
    text: str = attrs.field(init=False, default=attrs.Factory(_text_of, takes_self=True), eq=False, repr=False)
    line_starts: tuple[int, ...] = attrs.field(
        init=False, default=attrs.Factory(_line_starts_of, takes_self=True), eq=False, repr=False
    )
    folded_text: str = attrs.field(init=False, default=attrs.Factory(_folded_of, takes_self=True), eq=False, repr=False)
    # Views of the evidence that several rules read (the signal in the log, ...), computed once.
    _derived: dict[str, object] = attrs.field(init=False, factory=dict, eq=False, repr=False)

    @classmethod
    def from_text(
        cls,
        text: str | bytes,
        *,
        returncode: int | None = None,
        config: TailConfig | None = None,
        node_id: str = "",
        losses: Sequence[LossSample] = (),
        hang: HangReport | None = None,
        probes: Sequence[ProbeResult] = (),
        resources: Sequence[ResourceSample] = (),
    ) -> Evidence:
        """Evidence from log text held in memory (tests, corpus, logs shipped over RPC).

        Args:
            text: the log; only its last ``config.max_bytes`` bytes are looked at.
            returncode: the process's exit status, if it exited.
            config: tail limits.
            node_id: the node the evidence is about.
            losses: recent loss values.
            hang: the hang detector's report.
            probes: node health probe results.
            resources: resource samples.

        Returns:
            The evidence.
        """
        data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
        tail = tail_from_bytes(data, config or TailConfig(), source="<text>")
        exit_info = None if returncode is None else ExitInfo(returncode)
        return cls(
            node_id=node_id,
            exit=exit_info,
            log=tail,
            losses=tuple(losses),
            hang=hang,
            probes=tuple(probes),
            resources=tuple(resources),
        )

    def lines(self) -> Sequence[str]:
        """The log lines, or an empty sequence when there is no log."""
        return self.log.lines if self.log is not None else ()

    def derived(self, key: str, compute: Callable[[Evidence], T]) -> T:
        """A view of this evidence that several rules read, computed by the first to ask.

        Args:
            key: names the view; one key, one `compute` (``"dlrover.signal_in_log"``).
            compute: a pure function of the evidence.

        Returns:
            What `compute` returned for this evidence, computed at most once.
        """
        if key not in self._derived:
            self._derived[key] = compute(self)
        return cast(T, self._derived[key])
