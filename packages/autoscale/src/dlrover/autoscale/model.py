"""Observed throughput samples and the fitted model of how a job's throughput grows with its workers.

The model is the step-time decomposition Optimus (Peng et al., EuroSys 2018) uses for data-parallel jobs: the time
to process one sample on `n` workers is

    1 / T(n) = a + b / n + c * n,        a, b, c >= 0

`b / n` is the work that divides among workers, `a` a fixed per-sample cost, and `c * n` the communication and
synchronisation cost that grows with the number of workers. The curve rises with diminishing returns and, when
`c > 0`, peaks at `n = sqrt(b / c)`. It is linear in (a, b, c), so a non-negative least-squares fit is exact and
needs no starting point; we weight each sample by its own reciprocal so the fit minimises relative error, because
throughput at 1 worker and at 100 workers differ by orders of magnitude.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import attrs
import numpy as np

from dlrover.autoscale._validate import check_count, check_positive
from dlrover.autoscale.errors import InsufficientSamplesError
from dlrover.common import ConfigError

__all__ = ["ThroughputSample", "ThroughputModel", "fit_throughput_model", "nnls_small"]

# A fit from this many distinct worker counts determines all three coefficients; fewer lower the confidence.
_FULL_COVERAGE_COUNTS = 3
# A relative RMS error this large drives the confidence to zero.
_ZERO_CONFIDENCE_RELATIVE_RMSE = 0.25


@attrs.frozen
class ThroughputSample:
    """Throughput measured while the job ran with a given number of workers.

    Args:
        workers: the number of workers when it was measured (>= 1).
        throughput: samples (or steps) per second, > 0.
        ps: the number of parameter servers then (0 for all-reduce jobs); recorded, not fitted.

    Raises:
        InvalidMetricError: if a value is missing, NaN, negative or zero where it must be positive.
    """

    workers: int
    throughput: float
    ps: int = 0

    def __attrs_post_init__(self) -> None:
        check_count("workers", self.workers, minimum=1)
        check_positive(f"throughput at {self.workers} workers", self.throughput)
        check_count("ps", self.ps)


def nnls_small(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares `min ||a x - y||, x >= 0` for a handful of columns.

    The optimum is the unconstrained least-squares solution on its own support, so trying every support and keeping
    the best non-negative one is exact. With three columns that is seven small solves: cheaper and simpler than an
    active-set method, and it has no iteration limit to hit.

    Args:
        a: the design matrix, shape (m, k), k small (it is exponential in k).
        y: the targets, shape (m,).

    Returns:
        The coefficients, shape (k,), all >= 0.
    """
    _rows, k = a.shape
    best = np.zeros(k)
    best_residual = float(np.dot(y, y))
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            cols = list(support)
            coef, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            residual = float(np.sum((a[:, cols] @ coef - y) ** 2))
            # Strictly better only: on ties the smaller support wins, which keeps the model simplest.
            if residual < best_residual * (1 - 1e-12) - 1e-300:
                best_residual = residual
                best = np.zeros(k)
                best[cols] = coef
    return best


@attrs.frozen
class ThroughputModel:
    """A fitted throughput curve `T(n) = 1 / (a + b / n + c * n)` and how far to trust it.

    Args:
        a: fixed seconds per sample, >= 0.
        b: seconds per sample that divide among workers, >= 0.
        c: seconds per sample added by each worker (communication), >= 0.
        confidence: in [0, 1]; the product of how many distinct worker counts the fit saw (three or more count
            fully) and how well it matches them (1 - relative RMS error / 0.25, floored at 0).
        relative_rmse: the root-mean-square relative error of the fit on its samples.
        max_observed_workers: the largest worker count seen; predictions beyond it are extrapolations.
        note: how the model was obtained, for explanations.

    Raises:
        ConfigError: if a coefficient is negative or NaN, all are zero, or confidence is outside [0, 1].
    """

    a: float
    b: float
    c: float
    confidence: float = 1.0
    relative_rmse: float = 0.0
    max_observed_workers: int = 0
    note: str = ""

    def __attrs_post_init__(self) -> None:
        for name in ("a", "b", "c", "relative_rmse"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ConfigError(f"throughput model coefficient {name} must be finite and >= 0, got {v}")
        if self.a + self.b + self.c <= 0:
            raise ConfigError("throughput model has all coefficients zero: it predicts infinite speed")
        if not 0 <= self.confidence <= 1:
            raise ConfigError(f"confidence must be in [0, 1], got {self.confidence}")

    @classmethod
    def linear(cls, per_worker_throughput: float, note: str = "assumed linear scaling") -> ThroughputModel:
        """A model in which every worker adds `per_worker_throughput`; confidence 0 (it is an assumption)."""
        check_positive("per_worker_throughput", per_worker_throughput)
        return cls(a=0.0, b=1.0 / per_worker_throughput, c=0.0, confidence=0.0, note=note)

    def predict(self, workers: int) -> float:
        """Predicted throughput with `workers` workers (0 for 0 workers)."""
        if workers <= 0:
            return 0.0
        return 1.0 / (self.a + self.b / workers + self.c * workers)

    def predict_many(self, workers: np.ndarray) -> np.ndarray:
        """`predict` over an array of worker counts (all >= 1)."""
        n = workers.astype(np.float64)
        return 1.0 / (self.a + self.b / n + self.c * n)

    @property
    def peak_workers(self) -> float:
        """The worker count at which predicted throughput peaks (infinity when it never does)."""
        if self.c <= 0:
            return math.inf
        return math.sqrt(self.b / self.c)


def fit_throughput_model(samples: Sequence[ThroughputSample]) -> ThroughputModel:
    """Fit `ThroughputModel` to observed samples by relative-error non-negative least squares.

    With samples at a single worker count the curve's shape is unknown: the result assumes linear scaling through
    the observed mean, with confidence 0 and a note saying so.

    Args:
        samples: the observations; several at one worker count are fine (they average).

    Returns:
        The fitted model.

    Raises:
        InsufficientSamplesError: if `samples` is empty.
    """
    if not samples:
        raise InsufficientSamplesError("cannot fit a throughput model from 0 samples; at least 1 is needed")
    n = np.array([s.workers for s in samples], dtype=np.float64)
    t = np.array([s.throughput for s in samples], dtype=np.float64)
    distinct = len(set(n.tolist()))
    max_n = int(n.max())
    if distinct == 1:
        # Mean of per-sample times per worker: 1/T = b/n  =>  b = n/T.
        b = float(np.mean(n / t))
        return ThroughputModel(
            a=0.0,
            b=b,
            c=0.0,
            confidence=0.0,
            max_observed_workers=max_n,
            note=f"samples at one worker count ({max_n}) only: assumed linear scaling",
        )
    y = 1.0 / t
    design = np.column_stack([np.ones_like(n), 1.0 / n, n])
    # Relative error: divide each row by its target so every sample weighs the same whatever its magnitude.
    coef = nnls_small(design / y[:, None], np.ones_like(y))
    a, b, c = (float(v) for v in coef)
    if a + b + c <= 0:
        # Only possible with degenerate input (the all-zero fit beat every support); fall back to linear.
        b = float(np.mean(n / t))
    pred = 1.0 / (a + b / n + c * n)
    rel_rmse = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    coverage = min(1.0, (distinct - 1) / (_FULL_COVERAGE_COUNTS - 1))
    quality = max(0.0, 1.0 - rel_rmse / _ZERO_CONFIDENCE_RELATIVE_RMSE)
    return ThroughputModel(
        a=a,
        b=b,
        c=c,
        confidence=coverage * quality,
        relative_rmse=rel_rmse,
        max_observed_workers=max_n,
        note=f"fitted to {len(samples)} samples at {distinct} worker counts, relative RMS error {rel_rmse:.3f}",
    )
