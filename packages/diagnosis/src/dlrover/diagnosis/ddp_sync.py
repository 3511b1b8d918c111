"""Lead times from a DDP model's gradient synchronization, for runtime straggler detection.

In a synchronous job every rank waits for the slowest in the gradient all-reduce, so every rank's
step takes as long as the slowest rank's and step times cannot tell which rank is slow. What
differs is how long each rank works before it first synchronizes: DDP reduces a bucket of
gradients as soon as the bucket is ready, so the step's first gradients end the rank's own work in
it. `report_gradient_sync` marks that moment in the rank's step slot (`StepReporter.synchronizing`,
a few stores into mapped memory, with the model's data-parallel group); the agent turns the marks
into each rank's median lead time and the master compares them within each group
(`dlrover.master.stragglers`).

Where the mark is made: by default when the step's first gradient is accumulated (a
post-accumulate-grad hook on each parameter, armed by the training forward, so one hook a step
does any work), and DDP's reducer runs its own all-reduce in C++; a Python communication hook in
its place cost about 0.5 ms of CPU a step on the GPT example's model, more than everything else
the mark does. Given a communication hook of the caller's (`hook=`), the mark is made in a wrapper
around it as each bucket is handed to it, the first call of a step counting.

What the lead sees and what it does not:

* It is read on the CPU, and on CUDA on the device too. The hook runs once the gradient
  kernels are *queued*, so the CPU's time shows a slow input pipeline, a slow host or CPU-bound
  work, not a slow GPU. For a model on a CUDA device the hook also records CUDA events where
  each training forward starts (a forward pre-hook, outside ``torch.no_grad()``) and where the
  first bucket is synchronized, and the step's lead is the longer of the CPU's and the device's
  time between them (`dlrover.diagnosis.device_leads`): a slow GPU shows. The device's time is
  read once the device got there, never waited for. The forward's start is the wrapped module's,
  after DDP's buffer broadcast; nothing is recorded while a CUDA graph is captured, nor for a
  module spread over several devices. A training forward that no backward follows (a skipped
  step) leaves its start for the next step, whose lead is then too long once (the agent's median
  of five absorbs it).
* A collective before the first gradient bucket ends the wait there instead: DDP broadcasts the
  module's buffers at the start of every forward (``broadcast_buffers=True``, the default, with
  buffers such as BatchNorm's), so a rank slow *before* its forward (its input pipeline) holds
  the others in that broadcast and its lead looks like theirs; slowness in the forward and
  backward still shows. ``broadcast_buffers=False`` (or no buffers) leaves the whole step in it.

Only torch's public API: ``Tensor.register_post_accumulate_grad_hook``,
`DistributedDataParallel.register_comm_hook` (a caller's hook), ``get_process_group_ranks``,
``Module.register_forward_pre_hook`` and ``torch.cuda.Event``. Other frameworks call
`StepReporter.synchronizing` themselves before their gradient synchronization.

Imported only where torch is (the package's ``torch`` extra). No postponed annotations here: DDP
checks a hook's annotations against its own classes, so they must be the classes themselves.
"""

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from dlrover.common import ConfigError
from dlrover.common.step_slots import StepReporter, optional_reporter
from dlrover.diagnosis.device_leads import DeviceLeads, TimedEvent

__all__ = ["report_gradient_sync"]

_log = logging.getLogger(__name__)

# torch exports GradBucket only where torch.distributed is available, which its stubs do not show.
_Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]  # type: ignore[name-defined]


def report_gradient_sync(
    model: torch.nn.Module,
    reporter: StepReporter | None = None,
    *,
    hook: _Hook | None = None,
    state: Any = None,
) -> bool:
    """Have `model` mark its rank's first gradient synchronization of each step.

    Call it once, after wrapping the model in DDP and before the first backward (with a hook of
    your own: DDP accepts one communication hook, registered before training). Mark step ends as usual
    (`StepReporter.step`, or a checkpointer's saves): a lead is measured from a step mark. A
    failure to mark never stops training: it is logged once and the reduction runs.

    Args:
        model: a ``torch.nn.parallel.DistributedDataParallel`` model.
        reporter: the step reporter to mark in; None: the one `dlrover-run` set up for this process.
        hook: a communication hook of your own to run after the mark; None: DDP's reducer
            reduces as without a hook, and the step's first accumulated gradient is marked.
        state: the state passed to `hook`; with no hook, a state given registers torch's
            ``allreduce_hook`` with it (the mark then made as buckets are handed to it).

    Returns:
        True when the mark was set up; False when the process is not run by `dlrover-run`
        (no step slot to mark): the model is left as it was.

    Raises:
        ConfigError: `model` is not a DDP model.
    """
    if not isinstance(model, DistributedDataParallel):
        raise ConfigError(f"report_gradient_sync needs a DistributedDataParallel model, got {type(model).__name__}")
    marks = reporter if reporter is not None else optional_reporter()
    if marks is None:
        return False
    # Neither a hook nor a state of the caller's: DDP's reducer reduces as it would without us.
    reducers_own = hook is None and state is None
    reduce = hook if hook is not None else allreduce_hook
    if hook is None and state is None:
        state = model.process_group
    # Leads compare within the ranks that reduce together (one pipeline stage's data-parallel
    # group), named by the group's smallest global rank.
    group = min(dist.get_process_group_ranks(model.process_group))
    marker = _Marker(marks, group, _device_leads(model), model)
    # On the wrapped module, which DDP runs after broadcasting its buffers: a peer slow to reach
    # that broadcast holds this rank there, which is not this rank's own work.
    model.module.register_forward_pre_hook(marker.forward_started)
    if reducers_own:
        # The step's first accumulated gradient is marked; DDP's reducer all-reduces in C++.
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(marker.first_gradient)  # type: ignore[no-untyped-call]
        return True

    def marked_then_reduced(hook_state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # type: ignore[name-defined]
        marker.synchronizing()
        return reduce(hook_state, bucket)

    model.register_comm_hook(state, marked_then_reduced)
    return True


class _Marker:
    """Marks a rank's first synchronization of each training step (see the module's notes).

    A training forward of the wrapped module arms it (and, on CUDA, records where the forward
    started); the first gradient after it (`first_gradient`, a post-accumulate-grad hook on every
    parameter: the others return at once) or each bucket handed to a communication hook
    (`synchronizing`, the reporter counting the step's first) marks. A failure to mark is logged
    once and ends the marking, never training.
    """

    def __init__(
        self, reporter: StepReporter, group: int, device_leads: DeviceLeads | None, model: DistributedDataParallel
    ) -> None:
        self._reporter = reporter
        self._model = model
        self._group = group
        self._device_leads = device_leads
        # An event recorded into a CUDA graph being captured would break the capture.
        self._capturing: Callable[[], bool] = (
            torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else _never
        )
        self._armed = False
        self._failed = False

    def forward_started(self, module: torch.nn.Module, args: Any) -> None:
        if self._failed or not module.training or not torch.is_grad_enabled():
            return  # an evaluation's forward is no training step's
        self._armed = True
        if self._device_leads is None:
            return
        try:
            if not self._capturing():
                self._device_leads.forward_started()
        except Exception as exc:  # an event the device refuses: reporting stops, training not
            self._stop(exc)

    def first_gradient(self, _parameter: torch.Tensor) -> None:
        # Under `no_sync()` (a micro-batch of gradient accumulation) DDP does not synchronize: the
        # rank's own work goes on to the micro-batch that does, as a communication hook would see.
        if self._armed and self._model.require_backward_grad_sync:
            self._armed = False
            self.synchronizing()

    def synchronizing(self) -> None:
        if self._failed:
            return
        try:
            if self._device_leads is None or self._capturing():
                self._mark(0.0)
            else:
                self._device_leads.synchronizing(self._mark)
        except Exception as exc:  # a closed reporter, an unmapped slot: reporting stops, training not
            self._stop(exc)

    def _mark(self, earlier_lead_s: float) -> float | None:
        return self._reporter.synchronizing(self._group, earlier_lead_s=earlier_lead_s)

    def _stop(self, exc: Exception) -> None:
        self._failed = True
        _log.warning("gradient synchronization is no longer reported in this process: %s", exc)


def _never() -> bool:
    return False


def _device_leads(model: DistributedDataParallel) -> DeviceLeads | None:
    """Device-side lead timing for a model whose parameters are on a CUDA device; None elsewhere
    (the CPU's time is the whole story there)."""
    devices = {parameter.device for parameter in model.parameters()}
    if len(devices) != 1:
        return None  # no parameters, or a module spread over several devices: whose stream to time?
    [device] = devices
    if device.type != "cuda":
        return None
    return DeviceLeads(lambda: _CudaEvent(device))


class _CudaEvent:
    """A timed CUDA event recorded on the current stream of the model's device (which, on
    autograd's thread, is the stream the forward ran the same work on)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def record(self) -> None:
        self._event.record(torch.cuda.current_stream(self._device))

    def query(self) -> bool:
        return bool(self._event.query())  # type: ignore[no-untyped-call]

    def elapsed_time(self, end_event: TimedEvent) -> float:
        if not isinstance(end_event, _CudaEvent):
            raise TypeError(f"a CUDA event times only against another, got {type(end_event).__name__}")
        return float(self._event.elapsed_time(end_event._event))
