"""Failure evidence is classified before the master's lock is taken, and on the whole evidence."""

from __future__ import annotations

import threading

from dlrover.common import ManualClock
from dlrover.diagnosis import ActionKind, Decision, FailureKind, RelaunchBudget, RestartBudget
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.journal import MemoryJournal
from dlrover.master.master import Master
from dlrover.master.policy import Classification, ClassifyingPolicy, Failure
from dlrover.master.scheduler.fake import FakeScheduler

OOM_TAIL = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def make(policy: object) -> Master:
    cfg = MasterConfig(job_name="cl", lifecycle=LifecycleConfig(nodes=NodeRange(1, 2)), heartbeat_interval_s=1.0)
    master = Master(cfg, FakeScheduler(), MemoryJournal(), ManualClock(), policy=policy)  # type: ignore[arg-type]
    master.start()
    master.register(0, "a", "h")
    return master


class LockProbe:
    """Classifies by checking, from another thread, whether the master's lock is free right now."""

    def __init__(self) -> None:
        self.master: Master | None = None
        self.lock_was_free: list[bool] = []
        self.seen_chars = 0

    def classify(self, node_id: int, kind: FailureKind, evidence: str, exit_code: int | None) -> Classification:
        assert self.master is not None

        def probe() -> None:
            # Non-blocking: True only when no thread holds the lock (an RLock held elsewhere fails).
            got = self.master._lock.acquire(blocking=False)  # type: ignore[union-attr]
            if got:
                self.master._lock.release()  # type: ignore[union-attr]
            self.lock_was_free.append(got)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        self.seen_chars = len(evidence)
        return Classification(FailureKind.NATIVE_CRASH, f"classified {len(evidence)} chars")

    def decide(self, failure: Failure) -> Decision:
        assert failure.classification is not None
        node_id = str(failure.node.node_id)
        return Decision(ActionKind.RESTART_PROCESSES, failure.kind, node_id, failure.classification.reason)


def test_classification_runs_outside_the_lock_and_decide_gets_it() -> None:
    probe = LockProbe()
    assert isinstance(probe, ClassifyingPolicy)
    master = make(probe)
    probe.master = master
    evidence = "x" * 60_000
    decision = master.report_failure(0, FailureKind.UNKNOWN, evidence)
    assert probe.lock_was_free == [True]
    assert probe.seen_chars == 60_000  # the whole evidence, not the clipped text kept in the history
    assert decision.outcome == "classified 60000 chars"


def test_the_diagnosis_policy_reads_the_end_of_a_long_log() -> None:
    """The decisive line of a log tail is at its end, past what the node history keeps."""
    master = make(DiagnosisFailurePolicy())
    evidence = "noise from the training loop\n" * 2000 + OOM_TAIL
    decision = master.report_failure(0, FailureKind.UNKNOWN, evidence, exit_code=1)
    assert "device_oom: rule 'cuda-oom'" in decision.outcome
    # Without a classification the policy reads the evidence itself, as before.
    policy = DiagnosisFailurePolicy()
    node = master.node(0)
    plain = policy.decide(Failure(node, FailureKind.UNKNOWN, OOM_TAIL, RestartBudget(0, 3), RelaunchBudget(0, 3), 1))
    assert "device_oom: rule 'cuda-oom'" in plain.reason
