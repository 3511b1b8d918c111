"""The throughput model: exact NNLS, recovery of known curves from noisy samples, confidence, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dlrover.autoscale import (
    InsufficientSamplesError,
    InvalidMetricError,
    ThroughputModel,
    ThroughputSample,
    fit_throughput_model,
)
from dlrover.autoscale.model import nnls_small
from dlrover.common import ConfigError

# Stated tolerance: with 3% multiplicative noise (3 samples at each of 6 worker counts from 1 to 32), the fitted
# curve predicts within 6% of the true curve everywhere in the observed range.
NOISE = 0.03
TOLERANCE = 0.06
COUNTS = (1, 2, 4, 8, 16, 32)

CURVES = [
    pytest.param(0.001, 0.1, 0.0002, id="peaks-at-22"),
    pytest.param(0.0, 0.05, 0.0, id="linear"),
    pytest.param(0.002, 0.08, 0.0, id="amdahl"),
    pytest.param(0.0, 1.0, 0.001, id="comm-heavy"),
]


def _true(a: float, b: float, c: float, n: float) -> float:
    return 1.0 / (a + b / n + c * n)


@pytest.mark.parametrize(("a", "b", "c"), CURVES)
@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_known_curve_from_noisy_samples(a: float, b: float, c: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = [ThroughputSample(n, _true(a, b, c, n) * float(rng.normal(1.0, NOISE))) for n in COUNTS for _ in range(3)]
    model = fit_throughput_model(samples)
    for n in range(1, 33):
        truth = _true(a, b, c, n)
        assert abs(model.predict(n) - truth) <= TOLERANCE * truth, (n, model)
    assert model.confidence > 0.5
    assert model.max_observed_workers == 32


@given(
    a=st.floats(0, 0.01),
    b=st.floats(0.001, 1.0),
    c=st.floats(0, 0.01),
    counts=st.sets(st.integers(1, 64), min_size=3, max_size=8),
)
def test_fit_is_exact_without_noise(a: float, b: float, c: float, counts: set[int]) -> None:
    samples = [ThroughputSample(n, _true(a, b, c, n)) for n in sorted(counts)]
    model = fit_throughput_model(samples)
    for n in sorted(counts):
        assert model.predict(n) == pytest.approx(_true(a, b, c, n), rel=1e-6)
    assert model.relative_rmse < 1e-6
    assert model.confidence == pytest.approx(1.0, abs=1e-5)


def test_confidence_falls_with_noise_and_with_few_counts() -> None:
    rng = np.random.default_rng(7)
    clean = [ThroughputSample(n, _true(0.001, 0.1, 0.0002, n)) for n in COUNTS]
    noisy = [ThroughputSample(n, _true(0.001, 0.1, 0.0002, n) * float(rng.normal(1, 0.15))) for n in COUNTS]
    two = [ThroughputSample(n, _true(0.001, 0.1, 0.0002, n)) for n in (4, 8)]
    c_clean = fit_throughput_model(clean).confidence
    c_noisy = fit_throughput_model(noisy).confidence
    c_two = fit_throughput_model(two).confidence
    assert c_clean > c_noisy
    assert c_two == pytest.approx(0.5, abs=1e-6)  # two of the three counts a full fit needs


def test_single_worker_count_assumes_linear_scaling_with_zero_confidence() -> None:
    model = fit_throughput_model([ThroughputSample(4, 40.0), ThroughputSample(4, 44.0)])
    assert model.confidence == 0.0
    assert model.c == 0.0
    assert model.predict(8) == pytest.approx(2 * model.predict(4))
    assert "one worker count" in model.note


def test_empty_history_is_a_clear_error() -> None:
    with pytest.raises(InsufficientSamplesError, match="0 samples"):
        fit_throughput_model([])


@pytest.mark.parametrize(
    ("workers", "throughput", "match"),
    [
        (4, float("nan"), "throughput at 4 workers is NaN"),
        (4, -1.0, "throughput at 4 workers must be >= 0, got -1.0"),
        (4, 0.0, "must be > 0, got 0.0"),
        (4, None, "throughput at 4 workers is missing"),
        (4, float("inf"), "must be finite"),
        (0, 10.0, "workers must be >= 1, got 0"),
        (None, 10.0, "workers is missing"),
        (2.5, 10.0, "workers must be an integer, got 2.5"),
        (4, "fast", "must be a number, got 'fast'"),
    ],
)
def test_bad_samples_are_rejected_naming_the_value(workers: object, throughput: object, match: str) -> None:
    with pytest.raises(InvalidMetricError, match=match):
        ThroughputSample(workers, throughput)  # type: ignore[arg-type]


def test_model_peak_and_predictions() -> None:
    m = ThroughputModel(a=0.0, b=1.0, c=0.01)
    assert m.peak_workers == pytest.approx(10.0)
    assert m.predict(10) > m.predict(9)
    assert m.predict(10) > m.predict(11)
    assert m.predict(0) == 0.0
    assert math.isinf(ThroughputModel.linear(5.0).peak_workers)
    assert ThroughputModel.linear(5.0).predict(3) == pytest.approx(15.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"a": -1.0, "b": 1.0, "c": 0.0}, {"a": 0.0, "b": 0.0, "c": 0.0}, {"a": float("nan"), "b": 1.0, "c": 0.0}],
)
def test_invalid_models_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ThroughputModel(**kwargs)


@given(
    st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5), st.floats(-5, 5), st.floats(-5, 5)), min_size=3, max_size=10)
)
def test_nnls_small_satisfies_the_kkt_conditions(rows: list[tuple[float, float, float, float]]) -> None:
    data = np.array(rows)
    a, y = data[:, :3], data[:, 3]
    # Ill-conditioned designs have optima at astronomically large coefficients that no least-squares solver
    # represents; the model's own design ([1, 1/n, n] over distinct counts) is well conditioned.
    assume(np.linalg.cond(a) < 1e6)
    x = nnls_small(a, y)
    assert np.all(x >= 0)
    grad = a.T @ (a @ x - y)
    scale = 1e-6 * (1 + float(np.abs(a).sum() * (np.abs(y).sum() + 1)))
    for xi, gi in zip(x, grad, strict=True):
        # Optimal non-negative LS: zero gradient where x > 0, non-negative gradient where x == 0.
        if xi > 0:
            assert abs(gi) <= scale
        else:
            assert gi >= -scale
