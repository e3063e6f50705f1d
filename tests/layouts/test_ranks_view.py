"""The ranks view on a real two-rank run: two real Monitors (rank 0 and 1 of world size 2) train side by side,
rank 1 sleeping in its data phase, as a straggling data loader under torchrun would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.ranks import STEPS, STRAGGLE_S, record_two_ranks

from gpudash.server.layouts import ranks
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.pages import build_run_page
from gpudash.server.layouts.run_page import summary_children
from gpudash.store.reader import RunReader


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_two_ranks(tmp_path_factory.mktemp("ranks") / "ddp")


def _frames(run_dir: Path):  # type: ignore[no-untyped-def]
    reader = RunReader(run_dir)
    try:
        view = load_view(reader)
    finally:
        reader.close()
    return view.frame("steps"), view.frame("memory")


def test_rank_rows_side_by_side(two_ranks: Path) -> None:
    steps, memory = _frames(two_ranks)
    rows = ranks.rank_rows(steps, memory)
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert r["steps"] == STEPS
        assert r["memory_peak"].endswith("B") and r["memory_peak"] != "-"
        assert r["tokens_s"] != "-" and r["samples_s"] != "-"
        assert {"data_median", "forward_median", "backward_median", "optimizer_median"} <= set(r)
    # rank 1 sleeps 30 ms in data; rank 0 spends that time waiting inside backward
    data = [float(r["data_median"].split()[0]) for r in rows]
    assert rows[1]["data_median"].endswith("ms") and data[1] >= 1000 * STRAGGLE_S * 0.9
    table = ranks.ranks_table(rows)
    assert [c["id"] for c in table.columns][:2] == ["rank", "steps"]


def test_downsampled_page_shows_every_rows_numbers(two_ranks: Path) -> None:
    """Drawn from frames downsampled for the charts, the ranks table and lights still say what every row says
    (the step-by-step comparisons included: numpy, cheap over every row): each rank's tokens/s is its wall-time
    rate (analysis.rates, as the job's), not a ratio of the rows kept."""
    import gpudash
    from gpudash.analysis.ranks import rank_summary
    from gpudash.analysis.rates import fmt_rate, rate_of
    from gpudash.units import fmt_num

    run = gpudash.load_run(two_ranks)
    whole = ranks.rank_rows(run.steps, run.memory)
    kept = run.steps.iloc[::3], run.memory.iloc[::3]  # a third of the rows, as a long run's charted frames
    assert ranks.rank_rows(*kept) != whole
    box = ranks.ranks_children(*kept, None, (run.steps, run.memory))
    table = next(c.children for c in box if getattr(c, "className", "") == "ranks-table")
    assert table.data == whole
    assert [r["steps"] for r in table.data] == [STEPS, STEPS]  # not the rows kept
    summary = rank_summary(run)
    for rank, row in zip((0, 1), whole, strict=True):
        rate = rate_of(run.steps[run.steps["rank"] == rank], "tokens")
        assert rate is not None and summary.loc[rank, "tokens_per_s"] == rate
        assert row["tokens_s"] == fmt_num(rate)
    job = rate_of(run.steps, "tokens")  # the two ranks ran side by side: each did about half the job's tokens
    assert job is not None and fmt_rate(job) != "-"
    assert 0.4 * job < summary["tokens_per_s"].min() <= summary["tokens_per_s"].max() < 0.6 * job


def test_straggler_lights_name_the_rank_and_phase(two_ranks: Path) -> None:
    steps, memory = _frames(two_ranks)
    lights = {name: (color, detail) for name, color, detail in ranks.straggler_lights(steps, memory)}
    assert set(lights) == {"straggler", "step-time skew", "slowest phase", "memory imbalance"}
    assert lights["straggler"][1] == "rank 1 (slow in data)"
    color, detail = lights["slowest phase"]
    assert detail.startswith("data: rank 1 slowest in")
    assert detail.endswith("rank 0 waits for it in backward")
    assert color in ("amber", "red")  # 30 ms of a step that is mostly that sleep
    # the barrier lines the step ends up: step time differs little, memory (same model) not at all
    assert lights["memory imbalance"][0] == "green"
    assert lights["memory imbalance"][1] == "ranks within 0.5 % of the mean"


def test_unsynchronized_straggler_shows_in_step_time(tmp_path: Path) -> None:
    run_dir = record_two_ranks(tmp_path / "async", steps=6, straggle_rank=0, sync=False)
    steps, memory = _frames(run_dir)
    lights = {name: (color, detail) for name, color, detail in ranks.straggler_lights(steps, memory)}
    assert lights["step-time skew"][0] == "red"
    assert lights["step-time skew"][1].startswith("slowest rank 0 (100 % of steps)")
    assert lights["straggler"] == ("red", "rank 0 (slow in data)")


def test_rank_step_figure_one_trace_per_rank(two_ranks: Path) -> None:
    steps, _ = _frames(two_ranks)
    fig = ranks.rank_step_figure(steps)
    assert [t.name for t in fig.data] == ["rank 0", "rank 1"]
    for t in fig.data:
        assert list(t.x) == list(range(STEPS))
        assert min(t.y) > 0


def test_run_page_has_ranks_section_only_with_two_ranks(two_ranks: Path, runs_dir: Path) -> None:
    reader = RunReader(two_ranks)
    try:
        page = build_run_page("ddp", reader)
    finally:
        reader.close()
    text = str(page)
    assert "ranks-view" in text and "straggler-lights" in text and "rank-step-graph" in text
    reader = RunReader(runs_dir / "plain")
    try:
        page = build_run_page("plain", reader)
    finally:
        reader.close()
    text = str(page)
    assert "ranks-box" in text and "ranks-view" not in text and "rank-step-graph" not in text


def test_single_rank_has_no_ranks_children(runs_dir: Path) -> None:
    steps, memory = _frames(runs_dir / "plain")
    assert ranks.ranks_box(steps, memory) == []
    assert ranks.ranks_children(steps.iloc[0:0], memory) == []


def test_summary_shows_saving_and_step_range() -> None:
    from gpudash.analysis.verdict import Verdict

    v = Verdict(kind="input-bound", title="Input-bound <b>x</b>", severity="warn", evidence=["data 40 %"],
                recommendation="more workers", saving="about 30 % of step time <script>", steps=(3, 9))
    out = summary_children([v])
    text = str(out)
    assert "saves: " in text and "about 30 % of step time <script>" in text
    assert "(steps 3–9)" in text
    one = summary_children([Verdict(kind="oom", title="OOM", severity="bad", steps=(5, 5))])
    assert "(step 5)" in str(one) and "saves" not in str(one)


@pytest.mark.slow
def test_torchrun_ddp_run_names_the_straggler(tmp_path: Path) -> None:
    """The real thing: examples/ddp_train.py under torchrun (2 ranks, gloo, DDP), rank 1 slow at loading data."""
    pytest.importorskip("torch.distributed.run")
    example = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
    run_dir = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(example),
           str(run_dir), "--steps", "8", "--straggle-rank", "1", "--straggle-s", "0.03"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps, memory = _frames(run_dir)
    rows = ranks.rank_rows(steps, memory)
    assert [(r["rank"], r["steps"]) for r in rows] == [(0, 8), (1, 8)]
    assert "tokens_s" not in rows[0]  # the example counts samples only: no empty column
    assert all(r["memory_peak"].endswith("KiB") for r in rows)
    lights = {name: (color, detail) for name, color, detail in ranks.straggler_lights(steps, memory)}
    assert lights["straggler"] == ("red", "rank 1 (slow in data)")
    assert lights["slowest phase"][1].endswith("rank 0 waits for it in backward")
    fig = ranks.rank_step_figure(steps)
    assert [t.name for t in fig.data] == ["rank 0", "rank 1"] and all(len(t.x) == 8 for t in fig.data)


def test_many_rank_summary_and_ranks_section_name_the_straggler(tmp_path: Path) -> None:
    """64 ranks x 2,000 steps, rank 7's backward 4x the others' (no all-reduce evening the step times out):
    ``/api/runs/<id>/summary`` names rank 7 (its facts and its verdicts), and so does the run page's Ranks
    section, built from the page's downsampled frames and the full ones as the server builds it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from ranks_page import SLOW, record  # the benchmark's run (benchmarks/ranks_page.py)

    from gpudash.server.app import create_app

    record(tmp_path / "r64")
    body = create_app(tmp_path).server.test_client().get("/api/runs/r64/summary").json
    assert body["facts"]["ranks"] == 64 and body["facts"]["rank_stragglers"] == [SLOW]
    assert [v["title"] for v in body["verdicts"] if "straggler" in v["title"]] == [f"Rank {SLOW} is a straggler"]
    reader = RunReader(tmp_path / "r64")
    try:
        page = str(build_run_page("r64", reader))
    finally:
        reader.close()
    assert f"rank {SLOW} on node00: " in page  # the top stragglers' line
