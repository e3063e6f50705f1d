"""The leak rule on series whose answer is known: a steady leak is found at its rate, and what only looks like
growth (warm-up, the allocator's caching, evaluation and checkpoint spikes, noise, a one-off jump, a step whose
size grows) is not a leak."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpudash.analysis.leak import MIN_GROWTH_BYTES, Leak, floor_growth, leak_of, leak_text

MiB = 2**20
rng = np.random.default_rng(0)


def _steps(n: int = 600) -> np.ndarray:
    return np.arange(n, dtype=float)


def _noise(n: int, scale: float = 2 * MiB) -> np.ndarray:
    return rng.uniform(0, scale, n)


def test_a_steady_leak_is_found_at_its_rate_and_since_when() -> None:
    x = _steps()
    rate = 2.1 * MiB
    y = 4e9 + np.where(x >= 200, (x - 200) * rate, 0.0) + _noise(len(x))
    g = floor_growth(x, y, first_step=0)
    assert g is not None
    assert g.per_step_bytes == pytest.approx(rate, rel=0.02)
    assert 150 <= g.since_step <= 260 and g.last_step == 599


def test_evaluation_and_checkpoint_spikes_neither_hide_a_leak_nor_make_one() -> None:
    x = _steps(1000)
    spikes = np.where((x % 100) < 8, 3e9, 0.0)  # every 100 steps an evaluation holds 3 GB for 8 steps
    flat = 5e9 + spikes + _noise(len(x))
    assert floor_growth(x, flat, first_step=0) is None
    rate = 1.0 * MiB
    leaking = flat + x * rate
    g = floor_growth(x, leaking, first_step=0)
    assert g is not None and g.per_step_bytes == pytest.approx(rate, rel=0.05)


def test_warm_up_and_caching_that_settle_are_no_leak() -> None:
    x = _steps(800)
    settling = 2e9 + 800 * MiB * (1 - np.exp(-x / 120)) + _noise(len(x))  # caches filling, ever slower
    assert floor_growth(x, settling, first_step=0) is None
    jump = 2e9 + np.where(x > 500, 400 * MiB, 0.0) + _noise(len(x))  # a second model loaded once, kept
    assert floor_growth(x, jump, first_step=0) is None


def test_noise_and_tiny_growth_are_no_leak() -> None:
    x = _steps(2000)
    assert floor_growth(x, 1e9 + _noise(len(x), 50 * MiB), first_step=0) is None
    assert floor_growth(x, 1e9 + x * (MIN_GROWTH_BYTES / 4000), first_step=0) is None  # 2 MiB in all


def test_growth_that_follows_the_steps_size_is_no_leak() -> None:
    """Bucketing from short to long sequences: memory grows with the step's tokens, not step after step."""
    x = _steps(600)
    tokens = 1024 * (1 + (x // 50))  # a longer bucket every 50 steps
    y = 1e9 + tokens * 64 * 1024.0 + _noise(len(x))
    assert floor_growth(x, y, first_step=0) is not None  # without the tokens it looks like one
    assert floor_growth(x, y, first_step=0, tokens_steps=x, tokens=tokens) is None
    leak = y + x * 4 * MiB  # a real leak under steady-sized steps is still one
    flat_tokens = np.full(len(x), 4096.0)
    assert floor_growth(x, leak, first_step=0, tokens_steps=x, tokens=flat_tokens) is not None


def test_bucketed_growth_in_live_windows_is_no_leak() -> None:
    """The zoo's bucketed loop (a longer bucket every 25 steps) seen through trailing windows of irregular host
    samples, as the live watch sees it: growth that follows the step's size is never a leak. The rule that asked
    the size to rise in most rising blocks called 22 of these 400 windows a leak (and one full test run's)."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        end, n = int(rng.integers(80, 300)), int(rng.integers(60, 300))
        xs = np.sort(rng.uniform(0, end, n)).round()
        tok_steps = np.arange(end + 1, dtype=float)
        tokens = 512.0 * (1 + np.minimum(tok_steps // 25, 11))
        y = 2e8 + np.interp(xs, tok_steps, tokens) * 8000.0 + rng.normal(0, 2e5, len(xs))
        assert floor_growth(xs, y, first_step=0, tokens_steps=tok_steps, tokens=tokens) is None, (end, n)


def test_too_short_a_window_is_not_judged() -> None:
    x = _steps(30)
    assert floor_growth(x, x * 100 * MiB, first_step=0) is None


def test_leak_of_names_the_category_that_grows_and_when_the_card_is_full() -> None:
    x = _steps(400)
    acts = 300 * MiB + x * MiB
    mem = pd.DataFrame({"step": x, "params_bytes": 500 * MiB, "grads_bytes": 500 * MiB,
                        "activations_bytes": acts, "allocated_bytes": 1000 * MiB + acts,
                        "peak_bytes": 1000 * MiB + acts + 200 * MiB})
    steps = pd.DataFrame({"step": x, "time": x})
    cap = 8 * 2**30
    lk = leak_of(mem, pd.DataFrame(), steps, capacity=cap, first_step=0)
    assert lk is not None and lk.source == "allocated_bytes" and lk.category == "activations"
    assert lk.per_step_bytes == pytest.approx(MiB, rel=0.01)
    peak_now = 1000 * MiB + acts[-1] + 200 * MiB
    assert lk.full_at_step == pytest.approx(399 + (cap - peak_now) / MiB, abs=2)
    text = leak_text(lk)
    assert "1.0 MiB per step" in text and "in activations" in text and f"step {lk.full_at_step:,}" in text
    assert Leak.from_dict(lk.as_dict()) == lk


def test_on_cpu_the_host_samples_are_placed_at_their_steps() -> None:
    x = _steps(300)
    host = pd.DataFrame({"time": 1000.0 + x * 0.1 + 0.05, "rss_bytes": 9e8 + x * 3 * MiB,
                         "malloc_used_bytes": 4e8 + x * 2 * MiB, "available_bytes": 10e9, "total_bytes": 16e9})
    steps = pd.DataFrame({"step": x, "time": 1000.0 + x * 0.1 + 0.1})  # no step column in host: by time
    mem = pd.DataFrame({"step": x, "params_bytes": 1e6, "activations_bytes": 2e6})
    lk = leak_of(mem, host, steps, first_step=0)
    assert lk is not None and lk.source == "malloc_used_bytes" and lk.category is None
    assert lk.per_step_bytes == pytest.approx(2 * MiB, rel=0.01)
    assert lk.full_at_step == pytest.approx(299 + 10e9 / (2 * MiB), abs=2)
    assert "on CPU" in lk.seen and "parameters, activations stay flat" in lk.seen
    rss_only = leak_of(mem, host.drop(columns="malloc_used_bytes"), steps, first_step=0)
    assert rss_only is not None and rss_only.source == "rss_bytes"


def test_on_cpu_the_step_boundary_reads_are_judged_before_the_timer_samples() -> None:
    """Issue 41: malloc's in-use bytes read at step ends (memory rows) are the series; the timer's host samples,
    landing anywhere inside steps and fewer on a loaded machine, are only the fallback of older runs."""
    x = _steps(120)
    mem = pd.DataFrame({"step": x, "malloc_used_bytes": 3e8 + x * 1.6 * MiB, "params_bytes": 1e6})
    host = pd.DataFrame({"step": [5.0, 60.0, 110.0], "malloc_used_bytes": 9e8, "rss_bytes": 1e9,
                         "available_bytes": 10e9, "total_bytes": 16e9})  # three samples: too few to judge
    steps = pd.DataFrame({"step": x, "time": x})
    lk = leak_of(mem, host, steps, first_step=0)
    assert lk is not None and lk.source == "malloc_used_bytes" and lk.since_step <= 12
    assert lk.per_step_bytes == pytest.approx(1.6 * MiB, rel=0.01)
    assert leak_of(mem.drop(columns="malloc_used_bytes"), host, steps, first_step=0) is None
