"""What the failure policy journals with every decision, and what restoring it costs.

    python benchmarks/master_policy_state.py             # 1,000 and 10,000 decisions
    python benchmarks/master_policy_state.py --endless   # no relaunch limit, no kind that aborts

A job of 8 ranks whose nodes fail in turn, with the kinds jobs see most (communication, hang,
unknown, killed, NaN loss, hardware), each diagnosed as that kind and handed the budgets the
master hands over (the node's --max-restarts 3, the rank's max_relaunches 3); a node relaunched or
removed comes back under a new id, as under the master. After N decisions, `DiagnosisFailurePolicy`
exports its state (version 3: the action policy's counters) and a fresh policy imports it.

The peer, measured in the same run: version 1, the inputs of every decision, which the policy
still reads by replaying them into a fresh action policy. With the default budgets the job aborts
after its 16th relaunch and every later decision is an abort, which version 1 still lists;
``--endless`` keeps the job going (no relaunch limit, kinds that only restart and relaunch), so
every node let go is remembered, up to `PolicyConfig.retired_nodes_kept` (1,024).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

from dlrover.diagnosis import (
    ActionKind,
    ActionPolicy,
    FailureKind,
    PolicyConfig,
    RelaunchBudget,
    RestartBudget,
    RuleRegistry,
)
from dlrover.master.diagnosis_policy import POLICY_STATE_VERSION, DiagnosisFailurePolicy
from dlrover.master.policy import Classification, Failure
from dlrover.master.records import NodeRecord
from dlrover.master.states import NodeState

RANKS = 8
COMMON = (
    FailureKind.COMMUNICATION,
    FailureKind.HANG,
    FailureKind.UNKNOWN,
    FailureKind.KILLED,
    FailureKind.NAN_LOSS,
    FailureKind.HARDWARE,
)
ENDLESS = (FailureKind.COMMUNICATION, FailureKind.HANG, FailureKind.UNKNOWN, FailureKind.KILLED)
_ENDS_NODE = (ActionKind.RELAUNCH_NODE, ActionKind.RELAUNCH_WITH_MORE_MEMORY, ActionKind.REMOVE_NODE)


def decide(n: int, config: PolicyConfig, registry: RuleRegistry, endless: bool) -> tuple[DiagnosisFailurePolicy, str]:
    """The policy after `n` decisions, and the version-1 state of the same decisions."""
    kinds = ENDLESS if endless else COMMON
    rank_limit = 10**9 if endless else 3
    policy = DiagnosisFailurePolicy(registry, ActionPolicy(config))
    current = list(range(RANKS))
    restarts = dict.fromkeys(current, 0)
    relaunched = [0] * RANKS
    next_id = RANKS
    version_1 = []
    for i in range(n):
        rank = i % RANKS
        node_id = current[rank]
        kind = kinds[(i // RANKS) % len(kinds)]
        failure = Failure(
            NodeRecord(node_id=node_id, rank=rank, state=NodeState.RUNNING),
            kind,
            "evidence",
            RestartBudget(min(restarts[node_id], 3), 3, "--max-restarts"),
            RelaunchBudget(min(relaunched[rank], rank_limit), rank_limit, "max_relaunches"),
            classification=Classification(kind, kind.value),
        )
        version_1.append(
            {
                "node": str(node_id),
                "kind": kind.value,
                "used": failure.restarts.used,
                "limit": failure.restarts.limit,
                "source": failure.restarts.source,
                "relaunch_possible": failure.relaunch_possible,
                "relaunches": [failure.relaunches.used, failure.relaunches.limit, failure.relaunches.source],
            }
        )
        action = policy.decide(failure).action
        if action.restarts_processes:
            restarts[node_id] += 1
        elif action in _ENDS_NODE:
            relaunched[rank] += action is not ActionKind.REMOVE_NODE
            current[rank] = next_id
            restarts[next_id] = 0
            next_id += 1
    return policy, json.dumps(version_1, separators=(",", ":"))


def restore(text: str, config: PolicyConfig, registry: RuleRegistry) -> None:
    """A fresh policy resumed from `text`."""
    DiagnosisFailurePolicy(registry, ActionPolicy(config)).import_state(text)


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Mean seconds of `fn()` over `repeat` calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endless", action="store_true", help="no relaunch limit, no kind that aborts")
    args = parser.parse_args()
    config = PolicyConfig(max_node_relaunches=10**9) if args.endless else PolicyConfig()
    registry = RuleRegistry.with_builtin_rules()
    print("endless job (no relaunch limit)" if args.endless else "default budgets")
    print(f"{'decisions':>9}  {'version':>7}  {'state':>10}  {'export':>9}  {'import':>9}")
    for n in (1_000, 10_000):
        policy, version_1 = decide(n, config, registry, args.endless)
        counters_state = policy.export_state()
        # Both read back to the same counters: the peer is the same state in the old form.
        restored = DiagnosisFailurePolicy(registry, ActionPolicy(config))
        restored.import_state(version_1)
        assert restored.export_state() == counters_state
        for version, text in ((1, version_1), (POLICY_STATE_VERSION, counters_state)):
            export_s = timed(policy.export_state, 20) if version == POLICY_STATE_VERSION else float("nan")
            import_s = timed(functools.partial(restore, text, config, registry), 5)
            export = f"{export_s * 1e3:>6.2f} ms" if version == POLICY_STATE_VERSION else f"{'-':>9}"
            print(f"{n:>9}  {version:>7}  {len(text.encode()) / 1024:>6.1f} KiB  {export}  {import_s * 1e3:>6.2f} ms")


if __name__ == "__main__":
    main()
