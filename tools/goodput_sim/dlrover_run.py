"""A DLRover strategy: the real master decides, simulated agents carry its decisions out.

The master is `dlrover.master.Master` itself (node lifecycle, the diagnosis classifier and action
policy, checkpoint commits, the autoscaler, the goodput accounting, and the rendezvous and shard
service it hosts: `data_feed`) on a `ManualClock` and the in-memory `FakeScheduler` and journal: no
gRPC, no threads, no sleeping. What an agent would send, the simulation calls: `register`,
`heartbeat` (with its samples where the autoscaler is on; rank 0's with its attempt reports),
`report_failure` with the kind the agent reports (`dlrover.diagnosis.reported_kind`) and the cause's
log excerpt,
`record_checkpoint` for each persisted checkpoint. A lost machine just falls silent: the master's
heartbeat timeout finds it. A round forms in the master's own rendezvous
(`dlrover.rendezvous.RendezvousManager`, hosted as `dlrover-master` hosts it): the agents join and
poll. What the simulation decides itself is only what the cluster and the training processes do:
how long each phase takes (the scenario's costs), that a broken node fails again until it is
replaced, and which checkpoint a round restores.

Restores: a round whose every node kept its shared memory restores the newest flash checkpoint
from it (`memory_load_gib_s`); one with a replaced node fetches it from the peer replica first where
`replicated_memory` is on (`replica_gib_s`), else every rank rolls back to the newest persisted
checkpoint (`checkpoint_gib / storage_read_gib_s`). Persisting runs in the background every
`storage_interval_s` and blocks nothing. A planned round (a replacement joining a world that went on
without it) seals a flash checkpoint first: it redoes no step.

With `Strategy.network_check`, every round's nodes are probed before training
(`Costs.network_check_s`), save once after a pass when the round has the same nodes, as
``dlrover-run --network-check`` does; a node a fault left broken fails its probe, reports it as the
agent would (`dlrover.diagnosis.NODE_CHECK_FAILED`, its agent exiting), and the others start a new
round without it.

A straggler (the ``slow`` effect) fails nothing: every step of a world that holds it takes
`straggler_slowdown` times as long until the slowness passes or the node leaves. A rank's lead time
(`Job.sync_lead_share` of its own step) shows its slowness once three of its five lead samples are
slowed, as the agent keeps them; from then every agent of the world heartbeats every
`heartbeat_interval_s` with its ranks' step stats until the master has judged them (again after a
restart: the new processes report afresh), the real `StragglerWatch` in the master judges them, and
with ``replace`` the master relaunches the node: the others restart without it as after any relaunch.
The time a straggler added to the steps kept is counted apart (`straggled_s`): the master's
accounting counts a slow step as useful.

An interruption that arrives while the job is recovering waits until training resumes.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from dlrover.common import ManualClock
from dlrover.diagnosis import (
    NODE_CHECK_FAILED,
    ActionKind,
    ActionPolicy,
    PolicyConfig,
    RankStepStats,
    reported_kind,
)
from dlrover.launcher.step_watch import LEAD_MIN_SAMPLES, LEAD_SAMPLES
from dlrover.master import MasterConfig
from dlrover.master.autoscaler import AutoscalerConfig
from dlrover.master.config import LifecycleConfig, NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.factory import default_policy
from dlrover.master.goodput import GoodputBreakdown
from dlrover.master.hosting import HostedRendezvous
from dlrover.master.journal import MemoryJournal
from dlrover.master.master import Master
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import NodeState
from dlrover.rendezvous import PollState, RendezvousConfig, RendezvousManager

from .data_feed import DataFeed
from .scenario import CAUSES, Scenario, Strategy
from .trace import Interruption
from .training import Stretch

__all__ = ["DLRoverRun", "simulate_dlrover"]

WALL0 = 1_700_000_000.0


class MeteredMaster:
    """The master, with the CPU time of the calls agents make counted by call: its cost at scale."""

    METERED = ("heartbeat", "register", "report_failure", "tick", "record_checkpoint")

    def __init__(self, master: Master) -> None:
        self._master = master
        self._tally: dict[str, list[float]] = {name: [0.0, 0] for name in self.METERED}
        self._calls = {name: self._metered(getattr(master, name), self._tally[name]) for name in self.METERED}

    @staticmethod
    def _metered(call: Any, tally: list[float]) -> Any:
        def metered(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return call(*args, **kwargs)
            finally:
                tally[0] += time.process_time() - started
                tally[1] += 1

        return metered

    def __getattr__(self, name: str) -> Any:
        if name in self._calls:
            return self._calls[name]
        return getattr(self._master, name)

    def costs(self) -> dict[str, dict[str, float]]:
        """CPU seconds per call and calls, by call (those made at least once)."""
        return {
            name: {"cpu_s_per_call": total / calls, "calls": calls}
            for name, (total, calls) in sorted(self._tally.items())
            if calls
        }


class _AcknowledgeFirst:
    """Told of a node's departure or restart before the shard service is: the training processes
    acknowledged what they trained before the master could take their shards back (real readers
    acknowledge after every step; the simulation's do it when it must, `DLRoverRun._settle_data`),
    and then the world stops training (a member's processes are gone from its collectives).

    The master logs what a library raises and goes on, so the first error is kept here for the run
    to raise after the master's call (`DLRoverRun._raise_hook_error`): a report the shard service
    refuses must stop the run, not become a log line.
    """

    def __init__(self, settle: Callable[[], object], stop: Callable[[int], None]) -> None:
        self._settle = settle
        self._stop = stop
        self.error: Exception | None = None

    def _acknowledge(self, node_id: int) -> None:
        try:
            self._settle()
            self._stop(node_id)
        except Exception as exc:
            if self.error is None:
                self.error = exc
            raise

    def node_departed(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        self._acknowledge(node_id)

    def processes_restarted(self, node_id: int, reason: str, *, data_suspect: bool = True) -> None:
        self._acknowledge(node_id)

    def node_finished(self, node_id: int, reason: str) -> None:
        """Nothing to acknowledge: a finished node's processes acknowledged their last step."""

    def job_finished(self, reason: str) -> None:
        """Nothing to acknowledge: the run acknowledges its last steps itself."""


class DLRoverRun:
    """One run of a ``dlrover`` strategy over a trace; `run` returns the master's breakdown."""

    def __init__(self, scenario: Scenario, strategy: Strategy) -> None:
        self.job, self.costs, self.strategy = scenario.job, scenario.costs, strategy
        full = self.job.nodes
        self.min_nodes = strategy.min_nodes or full
        config = self._master_config()
        lifecycle = config.lifecycle
        self.clock = ManualClock(0.0, WALL0)
        # The agents heartbeat the rendezvous while they train; the simulation sends none between rounds,
        # so silence and waiting never expire a node here: the master's departures take nodes out.
        forever = 10.0 * self.job.duration_s
        self.rendezvous = HostedRendezvous(
            RendezvousManager(
                RendezvousConfig(
                    min_nodes=self.min_nodes,
                    max_nodes=full,
                    # The simulated agents join one after another at one instant: with no last call at all
                    # the round would close at the min_nodes-th join, without the others.
                    last_call_s=max(self.costs.rendezvous_last_call_s, 1e-3),
                    join_timeout_s=forever,
                    heartbeat_timeout_s=forever,
                )
            ),
            self.clock,
        )
        self.scheduler = FakeScheduler(relaunches_nodes=strategy.backend_relaunches)
        self.data = DataFeed(
            self.clock,
            full=full,
            nodes_per_reader=self.job.model_parallel_nodes,
            shard_steps=self.job.shard_steps,
            lease_timeout_s=10.0 * self.job.duration_s,
        )
        policy = default_policy(config)
        if strategy.ladders:  # a what-if the master's flags cannot set yet
            ladders = strategy.policy_ladders()
            actions = PolicyConfig(
                ladders=ladders,
                max_node_relaunches=config.node_relaunch_limit,
                budget_window=lifecycle.budget_window,
            )
            policy = DiagnosisFailurePolicy(actions=ActionPolicy(actions))
        hosted = self.data.hosted
        self._acknowledge_first = _AcknowledgeFirst(self._settle_data, self._member_stopped)
        master = Master(
            config,
            self.scheduler,
            MemoryJournal(),
            self.clock,
            policy=policy,
            collaborators=[hosted, self.rendezvous],
            membership=[self._acknowledge_first, hosted, self.rendezvous],
        )
        hosted.attach(master)
        self.rendezvous.attach(master)
        self.master = MeteredMaster(master)
        self.insufficient_window_s = lifecycle.insufficient_nodes_window_s
        self._state()

    def _master_config(self) -> MasterConfig:
        """dlrover-master's configuration for the strategy."""
        strategy = self.strategy
        lifecycle = LifecycleConfig(
            nodes=NodeRange(self.min_nodes, self.job.nodes),
            heartbeat_timeout_s=self.costs.heartbeat_timeout_s,
            node_start_timeout_s=None,
            node_pending_timeout_s=None,
            max_relaunches=strategy.max_relaunches,
            max_process_restarts=strategy.max_process_restarts,
            max_job_failures=strategy.max_job_failures,
            budget_window_s=strategy.budget_window_s,
            spare_nodes=strategy.spare_nodes,
        )
        return MasterConfig(
            job_name="goodput-sim",
            lifecycle=lifecycle,
            rendezvous_last_call_s=self.costs.rendezvous_last_call_s,
            progress_event_interval_s=3600.0,
            max_node_relaunches=strategy.max_node_relaunches,
            heartbeat_interval_s=self.costs.heartbeat_interval_s,
            straggler_action=strategy.straggler_action,
            straggler_factor=strategy.straggler_factor,
            autoscale=AutoscalerConfig(mode=strategy.autoscale),
        )

    def _state(self) -> None:
        """The simulation's own state: the cluster, the world in force, and the queue of what comes."""
        self.comes_up_at: dict[int, float] = {}  # node id -> when the agent of a launched node starts
        self.silent: set[int] = set()  # nodes whose machine is gone
        self.broken: dict[int, str] = {}  # node id -> the cause of a fault that stays until it is replaced
        self.attempts: dict[int, int] = {}
        self.members: frozenset[int] = frozenset()  # the node ids of the round in force
        self.best = 0
        self.training_until = math.inf  # when the attempt in force stopped training (a failure, a planned round)
        self.attempt_step = 0  # the step the attempt in force started from (what it restored)
        self.scale_ticks_left = 0  # the autoscaler's ticks still to simulate after the last round
        self.persisted = 0
        self.flash_step = 0
        self.decisions: dict[str, int] = {}
        self.stopped = ""
        self.beaten_at = float("-inf")
        self.stats_beaten_at = float("-inf")  # the last round of heartbeats with step stats
        self.queue: list[tuple[float, int, str, int, int, int]] = []  # see _push
        self._queued = 0
        self.round_number = 0  # rounds formed so far
        self.grow_at: float | None = None  # when the queued planned round for a replacement is due
        # Set by the first round (`_round`): the training since it, and who reports it.
        self.stretch = Stretch(ready=0.0, start_step=0, step_s=self.job.step_time_s)
        self.rank0 = -1
        self.round_times = (0.0, 0.0, 0.0, 0.0)
        self.persist_from = 0.0
        # The network check: the nodes of the last round whose probes passed, and whether a round of
        # the same nodes has skipped its probes since (a pass is good for one skip).
        self.check_passed: frozenset[int] = frozenset()
        self.check_skipped = False
        # Stragglers: node id -> when its slowness started and when it passes; those the master has judged
        # (found, or saw slowed long enough to have found: the stats stay the same from then on).
        self.slow: dict[int, tuple[float, float]] = {}
        self.judged: set[int] = set()
        self.shown_beats: dict[int, int] = {}  # node id -> heartbeats that carried its slowed leads
        self.watching = False  # a heartbeat with step stats is queued
        self.straggled_s = 0.0  # what stragglers added to the steps kept
        self.events_seen = 0  # the master's events read so far

    def master_costs(self) -> dict[str, dict[str, float]]:
        """The master's CPU seconds per call and the number of calls, by call."""
        return self.master.costs()

    # -- the master's view -------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        """Move the clock to `t` with every live agent heartbeating and launched nodes coming up."""
        if t < self.clock.now():
            raise AssertionError(f"the simulation went back in time: {t} < {self.clock.now()}")
        for at in sorted({at for at in self.comes_up_at.values() if at <= t}):
            # The nodes up at `at` start, the master sees it at its next tick, and their agents register.
            self.clock.advance(at - self.clock.now())
            self._beat()
            started = sorted(nid for nid, when in self.comes_up_at.items() if when == at)
            for node_id in started:
                del self.comes_up_at[node_id]
                self.scheduler.set_state(node_id, ObservedState.RUNNING, host=f"host-{node_id}")
            self.master.tick()
            for node_id in started:
                if self.master.node(node_id).state is NodeState.STARTING:
                    self.master.register(node_id, f"agent-{node_id}", f"host-{node_id}")
        self.clock.advance(t - self.clock.now())
        self._beat()
        self.master.tick()
        self._follow_launches()

    def _beat(self) -> None:
        """Every live agent heartbeats (with its samples where the autoscaler is on), unless they all
        did within 0.9 heartbeat timeouts: real agents beat every few seconds, but the master reads
        beats for its timeout, and its samples rate and autoscaler take rates between beats however
        far apart, so it sees the same as long as none is older than the timeout at a tick, and every
        tick follows a call of this (the autoscaler's measurements after a round come from
        `_scale_tick`'s beats). The world's agents that sent their ranks' step stats
        (`_beat_with_steps`) within the last 0.1 timeouts are left out: a beat without stats would
        make the master forget the node's ranks, which a real agent's beats never do (each carries
        its ranks' stats), and theirs is young enough to last until this call beats again, 0.9
        timeouts on."""
        now = self.clock.now()
        timeout = self.costs.heartbeat_timeout_s
        if now - self.beaten_at < self._beat_gap:
            return
        self.beaten_at = now
        with_stats = self.members if now - self.stats_beaten_at < 0.1 * timeout else ()
        samples = self._samples(now)
        for node_id, node in self.master.nodes().items():
            if node.state is NodeState.RUNNING and node_id not in self.silent and node_id not in with_stats:
                mine = samples if samples is None or node_id in self.members else 0
                self.master.heartbeat(node_id, samples=mine)

    def _samples(self, t: float) -> int | None:
        """The samples each node of the world has trained by `t` since its processes started (the count
        its agent reports on every heartbeat): its whole part of a step's global batch every step, none
        after the attempt stopped training. None where the autoscaler is off: only the samples-per-second
        gauge would read them, and the simulation spares the master that."""
        if self.strategy.autoscale == "off":
            return None
        steps = self.stretch.start_step + self.stretch.steps_by(min(t, self.training_until)) - self.attempt_step
        return max(0, steps) * (self.job.nodes * _SAMPLES_PER_UNIT // max(1, len(self.members)))

    def _follow_launches(self) -> None:
        """Nodes the master launched come up `node_provision_s` later."""
        observed = self.scheduler.observe()
        for node_id in self.scheduler.specs:
            if node_id not in self.comes_up_at and observed[node_id].state is ObservedState.PENDING:
                self.comes_up_at[node_id] = self.clock.now() + self.costs.node_provision_s

    def _ranked(self) -> dict[int, int]:
        """rank -> node id of the current, running, ranked nodes."""
        out = {}
        for node_id, node in self.master.nodes().items():
            if node.state is NodeState.RUNNING and not node.spare and node.rank >= 0 and node_id not in self.silent:
                out[node.rank] = node_id
        return out

    def _pending_ranks(self) -> dict[int, int]:
        """rank -> node id of ranked nodes not running yet (launched, starting)."""
        return {
            n.rank: nid
            for nid, n in self.master.nodes().items()
            if n.state in (NodeState.PENDING, NodeState.STARTING) and not n.spare and n.rank >= 0
        }

    # -- the run -----------------------------------------------------------------------------

    def run(self, trace: Sequence[Interruption]) -> GoodputBreakdown:
        """Start the job, meet every interruption of `trace` (time-ordered) until the scenario's end or
        the master stops the job (`stopped` says why), and return the master's breakdown."""
        end = self.job.duration_s
        self.master.start()
        self.data.register()
        self._follow_launches()
        first_up = max(self.comes_up_at.values())
        self._advance(first_up)
        self._round(first_up)
        for item in trace:
            self._push(item.time_s, item.cause, item.node)
        while self.queue:
            t, _, what, trace_node, node_id, round_number = heapq.heappop(self.queue)
            if t >= end:
                break
            if node_id >= 0 and (round_number != self.round_number or node_id not in self.members):
                continue  # a repeat failure of a node that left the world, or of an earlier round
            if what == _SCALE and round_number != self.round_number:
                continue  # the autoscaler's beats after an earlier round: the newer round has its own
            if t < self.stretch.ready:  # recovering: it waits until training resumes
                self._push(self.stretch.ready, what, trace_node, node_id=node_id, round_number=self.round_number)
                continue
            self._dispatch(t, what, trace_node, node_id)
            self._raise_hook_error()
            if self.master.job_state.finished:
                break
        if self.master.job_state.finished:
            self.stopped = self.master.status().exit_reason
        else:
            self._report_progress(max(end, self.clock.now()))
            self.data.check(self._settle_data())
            self.master.stop("the simulated time is over")
        breakdown: GoodputBreakdown = self.master.status().breakdown
        return breakdown

    def _raise_hook_error(self) -> None:
        """Raise what the acknowledging membership hook raised inside a master call (the master only logs it)."""
        error = self._acknowledge_first.error
        if error is not None:
            raise error

    def _dispatch(self, t: float, what: str, trace_node: int, node_id: int) -> None:
        if what == _GROW:
            self.grow_at = None
            self._grow(t)
        elif what == _PACE:
            self._repace(t)
        elif what == _BEAT:
            self.watching = False
            self._beat_with_steps(t)
        elif what == _SCALE:
            self._scale_tick(t)
            return
        else:
            self._interrupt(t, what, trace_node=trace_node, node_id=node_id)
        if self.strategy.autoscale != "off" and not self.master.job_state.finished:
            self._follow_resize(self.clock.now())  # the autoscaler plans on any tick

    def _push(self, t: float, what: str, trace_node: int, *, node_id: int = -1, round_number: int = -1) -> None:
        """Queue an interruption (a cause, or `_GROW`) at `t`. One aimed at a node (`node_id`, a broken node
        failing again) holds only while that node is in the world of round `round_number`. Equal times are
        taken in the order they were queued."""
        self._queued += 1
        heapq.heappush(self.queue, (t, self._queued, what, trace_node, node_id, round_number))

    def _round(self, joined_at: float, *, planned_step: int | None = None) -> None:
        """Every running ranked node's agent joined by `joined_at` (an agent outlives its workers, so it
        rejoins as soon as it is told): the round forms by the rendezvous's rule, the workers start
        (`process_restart_s`) and restore, and training resumes."""
        costs = self.costs
        ranked = self._ranked()
        members = frozenset(ranked.values())
        world = len(members)
        formed = self._form_round(members, joined_at)
        checked = self._network_check(members, formed, planned_step)
        if checked is None:
            return  # a node failed its probe and left: the others formed another round, or the job ended
        workers = formed + checked + costs.process_restart_s
        # A node that joined or left since the last round had (or took) a shard no shared memory here holds.
        lost_memory = members != self.members
        shard = self.job.shard_gib
        memory_load = shard / costs.memory_load_gib_s
        replica_load = shard / costs.replica_gib_s + memory_load
        if planned_step is not None:
            step, load = planned_step, replica_load if lost_memory else memory_load
        elif not self.members:  # the job's first round
            step, load = 0, 0.0
        elif not lost_memory:
            step, load = self.flash_step, memory_load
        elif self.strategy.replicated_memory:
            step, load = self.flash_step, replica_load
        else:
            step, load = self.persisted, self.job.checkpoint_gib / costs.storage_read_gib_s
        self._advance(max(formed, self.clock.now()))
        self._deliver_pending()
        self.data.start_attempt([ranked[r] for r in sorted(ranked)], step, restore=bool(self.members))
        self.members = members
        self.attempt_step = step
        self.training_until = math.inf
        self.rank0 = ranked[min(ranked)]
        self.attempts[self.rank0] = self.attempts.get(self.rank0, 0) + 1
        self.round_times = (joined_at, formed, workers, load)
        slowdown = self._slowdown(workers + load)
        self.stretch = Stretch(
            ready=workers + load,
            start_step=step,
            step_s=self.job.step_time_s * self.job.nodes / world * slowdown,
            save_every=self.strategy.flash_every_steps,
            save_s=self.job.shard_gib / costs.flash_save_gib_s,
            slowdown=slowdown,
        )
        self.persist_from = self.stretch.ready
        self.round_number += 1
        for node_id, cause in sorted(self.broken.items()):
            if node_id in members:  # the fault is still there: it fails again at its first step
                self._push(
                    self.stretch.ready + self.stretch.step_s, cause, -1, node_id=node_id, round_number=self.round_number
                )
        # The new processes report their steps afresh and the master forgets the old ones: a straggler
        # still in the world is judged again once its new leads show.
        self.judged.clear()
        self.shown_beats.clear()
        self._watch_stragglers()
        self._expect_growth()
        if self.strategy.autoscale != "off":
            self.scale_ticks_left = _SCALE_TICKS
            self._push(self.stretch.ready + self._beat_gap, _SCALE, -1, round_number=self.round_number)

    @property
    def _beat_gap(self) -> float:
        """How often the simulated agents' heartbeats reach the master (see `_beat`)."""
        return 0.9 * self.costs.heartbeat_timeout_s

    def _expect_growth(self) -> None:
        """Nodes launched for ranks the world trains without (replacements, or the autoscaler's growth) join at
        a planned round once they are up."""
        pending = self._pending_ranks()
        if pending and len(self.members) < self.job.nodes and self.grow_at is None:
            self.grow_at = max(self.comes_up_at.get(nid, self.clock.now()) for nid in pending.values())
            self._push(self.grow_at, _GROW, -1)

    def _scale_tick(self, t: float) -> None:
        """The agents heartbeat with their samples and the master ticks, so its autoscaler measures the world
        and plans (`_SCALE_TICKS` beats after each round: enough to measure a node count and act on it).
        Nodes it launches join at a planned round once up; nodes it lets go leave at a planned round at once
        (their agents have the workers seal a flash checkpoint first)."""
        self.beaten_at = float("-inf")  # real agents beat every few seconds: this tick hears every one
        self._advance(t)
        rounds = self.round_number
        self._follow_resize(t)
        self.scale_ticks_left -= 1
        if self.round_number == rounds and self.scale_ticks_left > 0:
            self._push(t + self._beat_gap, _SCALE, -1, round_number=self.round_number)

    def _member_stopped(self, node_id: int) -> None:
        """The master let a member of the world go or restarts its processes: the world trains no further."""
        if node_id in self.members:
            self.training_until = min(self.training_until, self.clock.now())

    def _follow_resize(self, t: float) -> None:
        """Carry out a resize the master decided by `t`: nodes it let go leave the world at a planned round at
        once (their agents have the workers seal a flash checkpoint first; the others stopped when they
        left); nodes it launched join at one once up, and warm spares it gave a rank at one now."""
        gone = sorted(self.members - set(self._ranked().values()))
        if gone:
            stopped = min(t, self.training_until)
            self._report_progress(stopped)
            sealed = self.stretch.start_step + self.stretch.steps_by(stopped)
            self.training_until = stopped
            self._settle_data()
            self.best = max(self.best, sealed)
            for node_id in gone:
                self._leaves(node_id)
            self._count("resize: nodes let go, planned round")
            self._round(t, planned_step=sealed)
            return
        self._expect_growth()
        promoted = set(self._ranked().values()) - self.members
        if promoted and self.grow_at is None:
            # A warm spare the growth gave a rank runs already: it joins at a planned round now.
            self._grow(t)

    def _deliver_pending(self) -> None:
        """The agents hear what the master queued for them (a restart for a spare's round) at their next beat,
        seconds after it was decided: before the round it is for trains."""
        for node_id, node in self.master.nodes().items():
            if node.state is NodeState.RUNNING and node_id not in self.silent and self.master.pending_actions(node_id):
                self.master.heartbeat(node_id)

    def _form_round(self, members: frozenset[int], joined_at: float) -> float:
        """Every member's agent joins the master's rendezvous at `joined_at` and polls: the round completes at
        once when the whole job joined, else after the last call. Returns when it formed.

        Raises:
            AssertionError: no round formed, or one of other nodes than those that joined.
        """
        if not members:
            raise AssertionError("no node is left to form a round")
        names = {str(node_id) for node_id in members}
        with self.rendezvous.locked() as manager:
            for name in sorted(names):
                manager.join(name, joined_at)
            for at in (joined_at, joined_at + manager.config.last_call_s):
                if manager.poll(min(names), at).state is PollState.ASSIGNED:
                    held = manager.current_round
                    if held is None or set(held.members) != names:
                        raise AssertionError(f"the rendezvous formed {held} of other nodes than {sorted(names)}")
                    return at
        raise AssertionError(f"no round of {len(members)} nodes can form (min_nodes {self.min_nodes})")

    def _network_check(self, members: frozenset[int], formed: float, planned_step: int | None) -> float | None:
        """The seconds the round's network check takes before training (0: none, or its probes
        skipped), or None when a node failed its probe: it reported that and left, and the others
        went on to a new round (`_recover`; a planned round's sealed step is still what it restores)."""
        if not self.strategy.network_check:
            return 0.0
        if members == self.check_passed and not self.check_skipped:
            self.check_skipped = True  # a restart of the same nodes after a pass: probed next time
            return 0.0
        checked = formed + self.costs.network_check_s
        caught = sorted(nid for nid in members if nid in self.broken and CAUSES[self.broken[nid]].fails_node_check)
        if not caught:
            self.check_passed, self.check_skipped = members, False
            return self.costs.network_check_s
        self._advance(max(checked, self.clock.now()))
        for node_id in caught:
            cause = CAUSES[self.broken.pop(node_id)]
            evidence = (
                f"{NODE_CHECK_FAILED}: the network check left this node out before training\n"
                f"node {node_id} failed its probe with every partner:\n{cause.evidence}"
            )
            kind = reported_kind(node_check_failed=True)
            decision = self.master.report_failure(node_id, kind, evidence, exit_code=1, agent_exits=True)
            self._count(f"network check: {decision.kind.value}: {decision.action.value}")
            if self.master.job_state.finished:
                return None
            self.silent.add(node_id)  # its agent exits, whatever the answer
        self._follow_launches()
        self._recover(self.clock.now(), planned_step=planned_step)
        return None

    def _report_progress(self, until: float) -> None:
        """Rank 0's attempt report up to `until`, and the checkpoints persisted meanwhile."""
        joined, formed, workers, load = self.round_times
        report = self.stretch.report(
            self.rank0,
            self.attempts[self.rank0],
            until,
            self.best,
            wall0=WALL0,
            rendezvous=(joined, formed),
            workers_start=workers,
            load_s=load,
        )
        self._advance(max(until, self.clock.now()))
        if self.rank0 in self._ranked().values():
            self.master.heartbeat(self.rank0, attempts=[report])
        reached = self.stretch.start_step + self.stretch.steps_by(until)
        self.straggled_s += self.stretch.straggled_s(max(0, reached - self.best))
        self.best = max(self.best, reached)
        self.flash_step = self.stretch.last_saved_step(until)
        finished, _ = self._persists(until)
        if finished:
            step = self._persisted_step(finished)
            if step > self.persisted:
                self.persisted = step
                self.master.record_checkpoint(step, f"storage://goodput-sim/step-{step}", len(self.members))

    def _persists(self, until: float) -> tuple[int, range]:
        """The persists of the attempt by `until` (one starts every `storage_interval_s` of training from
        `persist_from` and takes the storage's write time): the number of the newest one finished (0: none
        yet), and the numbers of those still being written."""
        interval = self.strategy.storage_interval_s
        write_s = self.job.checkpoint_gib / self.costs.storage_write_gib_s
        finished = max(0, int((until - write_s - self.persist_from) // interval))
        started = int((until - self.persist_from) // interval)
        return finished, range(finished + 1, started + 1)

    def _persisted_step(self, number: int) -> int:
        """The step persist `number` of the attempt writes: the newest saved when it started."""
        return self.stretch.last_saved_step(self.persist_from + number * self.strategy.storage_interval_s)

    def _settle_data(self) -> int:
        """The training processes acknowledge the data of the steps they finished up to now (or until they
        stopped training), with the data position read at every step a restore may go back to: the
        persisted checkpoint, the flash one, persists still being written (`DataFeed.settle`). Called before
        the master can act on a node, and by the master itself before it tells the shard service of a
        departure (`_AcknowledgeFirst`), so it calls nothing of the master's but the journaling of the
        shard service's change (re-entering the master's lock on this one thread). Returns the step
        reached."""
        if not self.members:
            return 0  # before the first round: nothing trained
        until = min(self.clock.now(), self.training_until)
        stretch = self.stretch
        reached = stretch.start_step + stretch.steps_by(until)
        finished, writing = self._persists(until)
        restorable = {self.persisted, stretch.last_saved_step(until)}
        restorable.update(self._persisted_step(k) for k in (finished, *writing) if k)
        self.data.settle(reached, restorable)
        return reached

    def _interrupt(self, t: float, cause_name: str, *, trace_node: int, node_id: int) -> None:
        """Handle one interruption at `t` on node `node_id`, or (-1) on the member that the trace's node
        index maps to (the rank of that index while it trains, else one of the world's)."""
        costs = self.costs
        cause = CAUSES[cause_name]
        if node_id < 0:
            node_id = self._member_for(trace_node)
        self._report_progress(t)
        if cause.effect == "slow":
            self._slows(t, node_id)
            return
        self.training_until = min(self.training_until, t)
        self._settle_data()
        if cause.effect in ("lost", "preempted"):
            self._leaves(node_id)
            what = "lost node"
            found = t + costs.heartbeat_timeout_s + 1.0  # the master's heartbeat timeout finds it
            if cause.effect == "preempted":
                # The platform reclaims the machine after its notice and says so (a pod preempted or evicted):
                # the master observes it at its next tick, a disruption that is not the job's fault.
                what = "preempted node"
                found = t + costs.crash_detection_s
                self.scheduler.set_state(
                    node_id,
                    ObservedState.FAILED,
                    cause.exit_code,
                    f"host-{node_id}",
                    reason="Preempted",
                    evidence=cause.evidence,
                    disruption=True,
                )
            self._advance(found)
            if self.master.job_state.finished:
                self._count(f"{what}: abort_job")
                return
            node = self.master.node(node_id)
            if node.replaced_by is None:
                self._count(f"{what}: {node.state.value}")
            else:
                # A warm spare already runs; a relaunched node is only launched.
                spare = self.master.node(node.replaced_by).state is NodeState.RUNNING
                self._count(f"{what}: spare takes the rank" if spare else f"{what}: relaunch_node")
        else:
            if cause.effect == "broken":
                self.broken[node_id] = cause_name
            hung = cause.effect == "hang" and self.strategy.hang_detection != "nccl_timeout"
            detect = costs.crash_detection_s
            if cause.effect == "hang":
                detect = {
                    "nccl_timeout": costs.nccl_timeout_s,
                    "cpu_idle": costs.cpu_idle_hang_s,
                    "adaptive": max(5 * self.stretch.step_s, costs.adaptive_hang_floor_s),
                }[self.strategy.hang_detection]
            self._advance(t + detect)
            evidence = f"no step progress for {detect:.0f}s; stacks dumped" if hung else cause.evidence
            decision = self.master.report_failure(
                node_id, reported_kind(hung=hung), evidence, exit_code=None if hung else cause.exit_code
            )
            self._count(f"{decision.kind.value}: {decision.action.value}")
            if decision.action is ActionKind.ABORT_JOB or self.master.job_state.finished:
                return
            if decision.action.ends_node:
                self._leaves(node_id)
        self._follow_launches()
        self._recover(self.clock.now())

    def _member_for(self, trace_node: int) -> int:
        """The node id of the world's member that a trace's node index means: the rank of that index while
        it trains, else one of the world's."""
        ranked = self._ranked()
        if trace_node in ranked and ranked[trace_node] in self.members:
            return ranked[trace_node]
        in_world = sorted(r for r, nid in ranked.items() if nid in self.members)
        return ranked[in_world[trace_node % len(in_world)]]

    def _recover(self, decided: float, *, planned_step: int | None = None) -> None:
        """After a decision at `decided`, every running ranked node rejoins; a replacement joins once
        it is up, or later at a planned round where min_nodes lets the others go on without it.
        Fewer than min_nodes with no replacement coming (a rank let go): the master stops the job
        once that lasted its insufficient-nodes window."""
        join = decided
        pending = self._pending_ranks()
        short = len(self._ranked()) < self.min_nodes
        if short and not pending:
            self._advance(decided + self.insufficient_window_s + 1.0)
            if self.master.job_state.finished:
                return
        if pending and short:
            join = max([join, *(self.comes_up_at.get(nid, join) for nid in pending.values())])
        self._advance(join)
        if self.master.job_state.finished:
            return  # it stopped while the replacements started (its insufficient-nodes window)
        self._round(join, planned_step=planned_step)

    def _grow(self, t: float) -> None:
        """A replacement is up while the world trains without it: a planned round seals a flash
        checkpoint, and every node restarts into the full world."""
        self._advance(t)
        if len(self._ranked()) == len(self.members):
            return  # nobody new (the replacement failed meanwhile)
        stopped = min(t, self.training_until)
        self._report_progress(stopped)
        self.training_until = stopped
        self._settle_data()
        sealed = self.stretch.start_step + self.stretch.steps_by(stopped)
        self.best = max(self.best, sealed)
        self._count("replacement up: planned round")
        self._round(t, planned_step=sealed)

    def _count(self, what: str) -> None:
        self.decisions[what] = self.decisions.get(what, 0) + 1

    # -- stragglers --------------------------------------------------------------------------

    def _leaves(self, node_id: int) -> None:
        """The node's agent is gone for good (its machine, or the master let it go): its faults go with it."""
        self.silent.add(node_id)
        self.broken.pop(node_id, None)
        self._slowness_ends(node_id)

    def _slowness_ends(self, node_id: int) -> None:
        self.slow.pop(node_id, None)
        self.judged.discard(node_id)
        self.shown_beats.pop(node_id, None)

    def _slows(self, t: float, node_id: int) -> None:
        """`node_id` becomes a straggler at `t` (one already slow stays as slow)."""
        if node_id not in self.slow:
            self.slow[node_id] = (t, t + self.costs.straggler_lasts_s)
            self._push(t + self.costs.straggler_lasts_s, _PACE, -1)
            self._count("straggler: slowed")
        self._repace(t)

    def _slowdown(self, t: float) -> float:
        """How many times as long a step of the world in force takes at `t` (slowness that passed by then is
        forgotten)."""
        for node_id, (_since, until) in list(self.slow.items()):
            if until <= t:
                self._slowness_ends(node_id)
        if any(node_id in self.members for node_id in self.slow):
            return self.costs.straggler_slowdown
        return 1.0

    def _repace(self, t: float) -> None:
        """A straggler came or went at `t` while the job trains: the steps from the last one finished go on
        at the new pace, and the agents' step stats are watched while one is in the world."""
        slowdown = self._slowdown(t)
        if slowdown != self.stretch.slowdown:
            self._report_progress(t)
            self.stretch = self.stretch.continued(t, slowdown)
        self._watch_stragglers()

    def _watch_stragglers(self) -> None:
        """Queue the next heartbeat with step stats while a straggler the master has not judged is in the world:
        the first one once its lead shows (the beats before carry the same stats as every other rank's, which
        the master judges equal; the simulation spares itself those)."""
        unjudged = [nid for nid in self.slow if nid in self.members and nid not in self.judged]
        if self.watching or not unjudged:
            return
        self.watching = True
        stretch = self.stretch
        shows_at = min(
            stretch.end_of(stretch.steps_by(max(self.slow[nid][0], stretch.ready)) + _LEADS_TO_SHOW) for nid in unjudged
        )
        self._push(max(self.clock.now(), stretch.ready, shows_at) + self.costs.heartbeat_interval_s, _BEAT, -1)

    def _beat_with_steps(self, t: float) -> None:
        """Every agent of the world heartbeats at `t` with its ranks' step stats, as a real one does every
        interval (the others, at the simulation's own pace, send none: only a straggler needs them). The
        master judges them; a straggler it found is reported, and with ``replace`` its node is relaunched.
        Rank 0's steps are reported first: its node may be the one relaunched."""
        self._report_progress(t)
        if any(nid in self.members for nid in self.slow):
            self._send_step_stats(t)
        for event in self._new_events():
            if event.kind == "straggler":
                self.judged.update(int(n) for n in event.data.get("nodes", ()))
                self._count(f"straggler: found ({event.data.get('action', '')})")
        for node_id, beats in self.shown_beats.items():
            if beats >= _JUDGED_AFTER_BEATS and node_id not in self.judged:
                self.judged.add(node_id)
                self._count("straggler: not found")
        # Relaunched by the straggler judgment (a replacement named, or failed); one the autoscaler let go
        # (removed, no replacement) leaves at its planned round (`_follow_resize`).
        gone = [nid for nid in self.slow if nid in self.members and self._relaunched(nid)]
        if not gone:
            self._watch_stragglers()
            return
        # Relaunched: its agent exits, the others restart into a round without it (or with its replacement).
        self.training_until = min(self.training_until, t)
        for node_id in gone:
            self._count("straggler: relaunch_node")
            self._leaves(node_id)
        self._follow_launches()
        self._recover(self.clock.now())

    def _relaunched(self, node_id: int) -> bool:
        node = self.master.node(node_id)
        return node.state is not NodeState.RUNNING and (node.replaced_by is not None or node.state is NodeState.FAILED)

    def _send_step_stats(self, t: float) -> None:
        self.stats_beaten_at = t
        per_node = self.job.accelerators_per_node
        stretch = self.stretch
        done = stretch.steps_by(t)
        steps = stretch.start_step + done
        since = max(0.0, t - (stretch.end_of(done) if done else stretch.ready))
        nominal = stretch.step_s / stretch.slowdown
        lead = self.job.sync_lead_share * nominal
        for rank, node_id in sorted(self._ranked().items()):
            if node_id not in self.members:
                continue
            slowed = lead
            if node_id in self.slow:
                # The agent's median of its last five lead samples shows the slowness from the third slowed one.
                started = max(self.slow[node_id][0], stretch.ready)
                if done - stretch.steps_by(started) >= _LEADS_TO_SHOW:
                    # From here on its stats stay as they are: the master finds it now or never.
                    slowed = lead * self.costs.straggler_slowdown
                    self.shown_beats[node_id] = self.shown_beats.get(node_id, 0) + 1
            stats = [
                RankStepStats(
                    rank=rank * per_node + local,
                    steps=steps,
                    samples=0,
                    median_step_s=stretch.step_s,
                    since_step_s=since,
                    median_sync_lead_s=slowed,
                )
                for local in range(per_node)
            ]
            self.master.heartbeat(node_id, rank_steps=stats, samples=self._samples(t))

    def _new_events(self) -> list[Any]:
        out: list[Any] = []
        while True:
            batch = self.master.events(after_seq=self.events_seen, limit=1000)
            if not batch:
                return out
            self.events_seen = batch[-1].seq
            out.extend(batch)


_GROW = "(grow)"
_PACE = "(pace)"  # a straggler's slowness passed: the steps go on at the world's pace
_BEAT = "(beat)"  # the agents heartbeat with their ranks' step stats
_SCALE = "(scale)"  # the agents heartbeat with their samples, and the master's autoscaler plans
# Heartbeat rounds after each round while the autoscaler is on: its warm-up, a node count measured for
# `min_measure_s` (a minute) from beats 54 s apart, a plan, and the cool-down after a resize.
_SCALE_TICKS = 8
_SAMPLES_PER_UNIT = 1000  # samples of one node's part of a step's global batch at full size
# A straggler's slowed steps (with steps longer than the agent's monitor tick, one lead sample each)
# before its agent's heartbeat shows the slowness: the median of the newest LEAD_SAMPLES is a slowed
# one, and at least LEAD_MIN_SAMPLES are in.
_LEADS_TO_SHOW = max(LEAD_MIN_SAMPLES, LEAD_SAMPLES // 2 + 1)
# Heartbeat rounds with a straggler's slowed leads after which the master has judged them: its judgment runs at
# the first heartbeat after an interval, which may come before the straggler's own in the same round.
_JUDGED_AFTER_BEATS = 3


def simulate_dlrover(scenario: Scenario, strategy: Strategy, trace: Sequence[Interruption]) -> GoodputBreakdown:
    """Goodput of `strategy` (kind ``dlrover``) on `trace`."""
    return DLRoverRun(scenario, strategy).run(trace)
