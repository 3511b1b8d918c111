"""Lead times from a DDP model's gradient synchronization, for runtime straggler detection.

In a synchronous job every rank waits for the slowest in the gradient all-reduce, so every rank's
step takes as long as the slowest rank's and step times cannot tell which rank is slow. What
differs is how long each rank works before it first synchronizes. A DDP model calls its
communication hook as each gradient bucket becomes ready, just before the bucket's all-reduce:
the first call of a step ends the rank's own work in it. `report_gradient_sync` registers a hook
that marks that moment in the rank's step slot (`StepReporter.synchronizing`, a few stores into
mapped memory) and then runs the reduction it wraps; the agent turns the marks into each rank's
median lead time and the master compares them (`dlrover.master.stragglers`).

Only torch's public API: `DistributedDataParallel.register_comm_hook` and the default
``allreduce_hook``. Other frameworks call `StepReporter.synchronizing` themselves before their
gradient synchronization.

Imported only where torch is (the package's ``torch`` extra). No postponed annotations here: DDP
checks a hook's annotations against its own classes, so they must be the classes themselves.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from dlrover.common import ConfigError
from dlrover.common.step_slots import StepReporter, optional_reporter

# torch exports GradBucket only where torch.distributed is available, which its stubs do not show.
_Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]  # type: ignore[name-defined]

__all__ = ["report_gradient_sync"]


def report_gradient_sync(
    model: torch.nn.Module,
    reporter: StepReporter | None = None,
    *,
    hook: _Hook | None = None,
    state: Any = None,
) -> bool:
    """Have `model` mark its rank's first gradient synchronization of each step.

    Call it once, after wrapping the model in DDP and before the first backward (DDP accepts one
    communication hook, registered before training). Mark step ends as usual
    (`StepReporter.step`, or a checkpointer's saves): a lead is measured from a step mark.

    Args:
        model: a ``torch.nn.parallel.DistributedDataParallel`` model.
        reporter: the step reporter to mark in; None: the one `dlrover-run` set up for this process.
        hook: a communication hook of your own to run after the mark; None: DDP's default
            all-reduce (``allreduce_hook``).
        state: the state passed to `hook`; None with the default all-reduce: the model's process
            group, as DDP reduces without a hook.

    Returns:
        True when the hook was registered; False when the process is not run by `dlrover-run`
        (no step slot to mark): the model is left as it was.

    Raises:
        ConfigError: `model` is not a DDP model.
    """
    if not isinstance(model, DistributedDataParallel):
        raise ConfigError(f"report_gradient_sync needs a DistributedDataParallel model, got {type(model).__name__}")
    marks = reporter if reporter is not None else optional_reporter()
    if marks is None:
        return False
    reduce = hook if hook is not None else allreduce_hook
    if hook is None and state is None:
        state = model.process_group

    def marked_then_reduced(hook_state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # type: ignore[name-defined]
        marks.synchronizing()
        return reduce(hook_state, bucket)

    model.register_comm_hook(state, marked_then_reduced)
    return True
