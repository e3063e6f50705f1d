"""rank_skew on a real two-rank run directory written by two Monitors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpudash import load_run
from gpudash.analysis.ranks import rank_skew, rank_summary, straggler_summary
from gpudash.monitor import Monitor

STEPS = 6


def _write_rank(run_dir: Path, rank: int, data_sleep: float, extra_bytes: int) -> None:
    with Monitor(run_dir, rank=rank, world_size=2, host_hz=0, handle_signals=False) as m:
        for _ in range(STEPS):
            with m.step(samples=4):
                with m.phase("data"):
                    time.sleep(data_sleep)
                with m.phase("forward"):
                    time.sleep(0.001)
                m.log_memory(allocated_bytes=1_000_000 + extra_bytes)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "ddp"
    _write_rank(run_dir, 0, 0.001, 0)
    _write_rank(run_dir, 1, 0.12, 500_000)  # rank 1 is the straggler and holds more memory
    return run_dir


def test_rank_skew_names_the_straggler_and_the_heavy_rank(two_rank_run: Path) -> None:
    run = load_run(two_rank_run)
    assert run.ranks == [0, 1]
    skew = rank_skew(run)
    assert list(skew.index) == list(range(STEPS))
    assert (skew["ranks"] == 2).all()
    assert (skew["slowest_rank"] == 1).all()
    assert (skew["skew_s"] > 0.02).all()
    assert (skew["skew_ratio"] > 0).all()
    assert (skew["data_slowest_rank"] == 1).all()
    assert (skew["data_skew_s"] > 0.02).all()
    assert (skew["heaviest_rank"] == 1).all()
    assert skew["memory_max_bytes"].iloc[0] == 1_500_000
    # max / mean - 1 = 1.5 / 1.25 - 1
    assert skew["memory_imbalance"].iloc[0] == pytest.approx(0.2)
    assert skew.attrs["memory_source"] == "allocated_bytes"
    summary = straggler_summary(skew)
    assert summary["slowest_rank"] == 1 and summary["slowest_rank_share"] == 1.0
    assert summary["heaviest_rank"] == 1
    assert summary["slow_steps_share"] == 1.0
    table = rank_summary(run)
    assert list(table.index) == [0, 1]
    assert list(table["steps"]) == [STEPS, STEPS]
    assert table.loc[1, "data_median_s"] > table.loc[0, "data_median_s"] + 0.02
    assert table.loc[1, "step_median_s"] > table.loc[0, "step_median_s"]
    assert list(table["memory_peak_bytes"]) == [1_000_000, 1_500_000]
    assert list(table["slowest_share"]) == [0.0, 1.0]
    run.close()


def test_single_rank_gives_empty_frame(tmp_path: Path) -> None:
    _write_rank(tmp_path / "one", 0, 0.0, 0)
    run = load_run(tmp_path / "one")
    skew = rank_skew(run)
    assert skew.empty and "skew_ratio" in skew.columns
    assert straggler_summary(skew) == {"steps": 0}
    table = rank_summary(run)
    assert list(table.index) == [0] and "slowest_share" not in table
    run.close()


def test_sampled_activations_do_not_read_as_imbalance() -> None:
    """Two identical ranks that measured activations on different steps are balanced."""
    import types

    import pandas as pd

    from gpudash.analysis.ranks import rank_skew

    rows = []
    for rank, sampled in ((0, {0, 4}), (1, {2, 6})):
        for step in range(8):
            rows.append({"rank": rank, "step": step, "params_bytes": 100.0, "grads_bytes": 100.0,
                         "optimizer_bytes": 200.0, "activations_bytes": 300.0 if step in sampled else None})
    memory = pd.DataFrame(rows)
    steps = pd.DataFrame([{"rank": r, "step": s, "duration_s": 0.1} for r in (0, 1) for s in range(8)])
    skew = rank_skew(types.SimpleNamespace(steps=steps, memory=memory))
    later = skew.loc[2:]  # from step 2 on both ranks have measured activations once
    assert (later["memory_imbalance"].abs() < 1e-9).all()


def test_rank_skew_reads_gaps_and_repeats_as_a_pivot_would() -> None:
    """Steps some ranks did not record, a step recorded twice (the last row counts), a phase one rank did not
    time: every column as the step x rank pivot says it."""
    import types

    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(3)
    rows = [{"rank": r, "step": s, "duration_s": float(rng.uniform(0.1, 0.2)),
             "data_s": None if r == 2 else float(rng.uniform(0, 0.05))}
            for r in range(4) for s in range(40) if (r, s % 7) != (1, 3)]
    rows.append({"rank": 0, "step": 5, "duration_s": 9.0, "data_s": 0.5})  # step 5 again: the last one counts
    rows.append({"rank": 3, "step": 99, "duration_s": 0.1, "data_s": 0.0})  # one rank only: no row
    steps = pd.DataFrame(rows).sample(frac=1.0, random_state=1)
    mem = pd.DataFrame([{"rank": r, "step": s, "allocated_bytes": 1000.0 * (r + 1)} for r in range(4)
                        for s in range(0, 40, 2)])
    skew = rank_skew(types.SimpleNamespace(steps=steps, memory=mem))
    s = steps.drop_duplicates(["rank", "step"], keep="last")
    dur = s.pivot(index="step", columns="rank", values="duration_s")
    dur = dur[dur.notna().sum(axis=1) >= 2]
    assert list(skew.index) == list(dur.index) and 99 not in skew.index
    assert skew.loc[5, "duration_max_s"] == 9.0 and skew.loc[5, "slowest_rank"] == 0
    assert np.allclose(skew["duration_median_s"], dur.median(axis=1))
    assert np.allclose(skew["skew_s"], dur.max(axis=1) - dur.min(axis=1))
    assert (skew["slowest_rank"] == dur.idxmax(axis=1)).all()
    assert (skew["ranks"] == dur.notna().sum(axis=1)).all()
    data = s.pivot(index="step", columns="rank", values="data_s").reindex(dur.index)
    assert np.allclose(skew["data_skew_s"], data.max(axis=1) - data.min(axis=1))
    assert (skew["data_slowest_rank"] == data.fillna(-np.inf).idxmax(axis=1)).all()
    assert skew.loc[0, "heaviest_rank"] == 3 and np.isnan(skew.loc[1, "heaviest_rank"])
    assert skew.loc[0, "memory_imbalance"] == pytest.approx(4000 / 2500 - 1)
