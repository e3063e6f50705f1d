"""One truth: every surface states the same facts about a run (issue 11).

Every sample run and a few hand-made runs (spikes of different sizes, NaN
steps, fragmentation at 25 % and 35 %, sparse activation sampling, one OOM
recorded twice) go through ``gpudash report --format json``, ``gpudash info
--json``, ``/api/runs/<id>/summary``, ``/metrics``, the dashboard's run page
(lights and loss-spike markers) and the trainer's end-of-run lines.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.components import find
from helpers.components import text as shown_text

from gpudash.analysis.facts import run_facts
from gpudash.server.runcache import shared_cache
from gpudash.store import load_run

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p.name for p in (ROOT / "sample_runs").iterdir() if (p / "run.json").exists())
HAND_MADE = ["spikes", "nan-steps", "frag-25", "frag-35", "sparse-activations", "oom-twice-recorded", "lora", "mfu",
             "gaps"]
#: The "mfu" run's device: a peak and a model's FLOPs per token, as the trainer's estimate records them.
MFU_CONFIG = {"peak_flops": 1e12, "flops_per_token": 6e6}


def _loss(step: int) -> float:
    """A flat loss with small deterministic noise."""
    return 2.0 + 0.004 * math.sin(1.3 * step)


def _hand_made(run_dir: Path, kind: str, steps: int = 260) -> None:
    import time

    from gpudash.monitor import Monitor

    with Monitor(run_dir, name=kind, host_hz=0.0, device_hz=0.0, allocator=False, cuda_timing=False,
                 flush_interval=0.05, handle_signals=False, config=MFU_CONFIG if kind == "mfu" else None) as mon:
        for step in range(steps):
            if kind == "gaps" and step % 20 == 0:
                time.sleep(0.01)  # an evaluation between steps: time the run spent, so the rates count it
            with mon.step(samples=4, tokens=64):
                with mon.phase("data"):
                    if kind in ("mfu", "gaps"):
                        time.sleep(0.001)
                with mon.phase("forward"):
                    pass
                if step % 50 == 0:
                    with mon.phase("eval"):  # a phase of the user's own: opened, so it is a phase
                        pass
                loss = _loss(step)
                if kind == "spikes":
                    loss *= {100: 1.1, 150: 1.3, 220: 2.0}.get(step, 1.0)  # +10 % is noise-sized, not a spike
                if kind == "nan-steps" and step in (20, 21):
                    loss = math.nan
                if kind == "nan-steps" and step == 30:
                    loss = math.inf
                # scalars that end in _s but are no phases
                mon.log(loss=loss, eval_time_s=0.5, ckpt_total_s=1.0)
                mem: dict[str, Any] = {"params_bytes": 1000, "grads_bytes": 1000, "optimizer_bytes": 2000}
                if kind == "lora":  # adapters beside a frozen base: 100 of the 1000 parameter bytes train
                    mem.update(trainable_params_bytes=100, grads_bytes=100, optimizer_bytes=200)
                if kind != "sparse-activations" or step % 7 == 3:
                    mem["activations_bytes"] = 5000 + step
                if kind.startswith("frag-"):
                    mem.update(reserved_bytes=100_000, allocated_bytes=60_000,
                               inactive_split_bytes=int(kind.removeprefix("frag-")) * 1000 if step > 10 else 0)
                mon.log_memory(**mem)
                if kind == "oom-twice-recorded" and step in (40, 90):
                    if step == 40:  # the allocator observer and the caught exception record the same OOM
                        mon.event("oom", "CUDA out of memory (observer)", source="allocator_observer")
                    mon.event("oom", "CUDA out of memory. Tried to allocate 2.00 MiB", source="exception")


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one-truth")
    for name in SAMPLES:
        shutil.copytree(ROOT / "sample_runs" / name, root / name)
    for kind in HAND_MADE:
        _hand_made(root / kind, kind)
    yield root
    shared_cache().clear()


@pytest.fixture(scope="module")
def client(runs_dir: Path) -> Any:
    from gpudash.server.app import create_app

    return create_app(runs_dir, metrics=True).server.test_client()


@pytest.fixture(scope="module")
def metrics_text(client: Any) -> str:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    return str(resp.get_data(as_text=True))


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    from gpudash.cli import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _metric(text: str, name: str, run: str, **labels: str) -> float | None:
    want = {"run": run, **labels}
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m is None:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(got.get(k) == v for k, v in want.items()):
            return float(m.group(2))
    return None


@pytest.mark.parametrize("name", SAMPLES + HAND_MADE)
def test_every_surface_states_the_same_facts(name: str, runs_dir: Path, client: Any, metrics_text: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = runs_dir / name
    from gpudash.report import render_html

    run = load_run(path)
    try:
        facts = run_facts(run)
        html = render_html(run)
    finally:
        run.close()
    truth = facts.to_json()
    json.dumps(truth, allow_nan=False)  # JSON-safe

    report = _cli_json(capsys, "report", str(path), "--format", "json")
    info = _cli_json(capsys, "info", str(path), "--json")
    api = client.get(f"/api/runs/{name}/summary").get_json()
    assert report["facts"] == truth
    assert info["facts"] == truth
    assert api["facts"] == truth
    assert api["stability"] == truth["lights"]
    assert api["steps"] == truth["steps"]
    verdict_kinds = {v["kind"] for v in report["verdicts"]}
    assert ("loss-spike" in verdict_kinds) == bool(facts.loss_spike_steps)
    assert ("non-finite" in verdict_kinds) == bool(facts.nonfinite_steps)
    spike_verdict = next((v for v in report["verdicts"] if v["kind"] == "loss-spike"), None)
    if spike_verdict is not None:
        assert spike_verdict["numbers"]["count"] == len(facts.loss_spike_steps)

    if facts.steps:  # the HTML report's chart marks the same spikes
        assert sorted({int(m) for m in re.findall(r"step (\d+): loss spike", html)}) == list(facts.loss_spike_steps)

    # /metrics
    assert _metric(metrics_text, "gpudash_steps", name) == facts.steps
    assert _metric(metrics_text, "gpudash_ooms_total", name) == facts.oom_count
    assert _metric(metrics_text, "gpudash_loss_spikes_total", name) == len(facts.loss_spike_steps)
    assert _metric(metrics_text, "gpudash_nonfinite_steps_total", name) == len(facts.nonfinite_steps)
    labels = [dict(re.findall(r'(\w+)="([^"]*)"', m))
              for m in re.findall(r"^gpudash_phase_duration_seconds\{(.*)\} ", metrics_text, re.M)]
    exported = {lab["phase"] for lab in labels if lab.get("run") == name}
    assert exported == set(facts.phases)
    for key, value in facts.peak_bytes.items():
        if key != "measured" and value is not None:
            assert _metric(metrics_text, "gpudash_memory_category_bytes", name, category=key) is not None, key

    # the dashboard's run page: lights and the loss chart's spike markers
    from gpudash.server.layouts.pages import build_run_page
    from gpudash.store.reader import RunReader

    reader = RunReader(path)
    try:
        page = build_run_page(name, reader)
    finally:
        reader.close()
    lights = find(page, "stability-lights")
    shown = [shown_text(item) for item in lights.children]
    assert shown == [f"{li.signal} {li.detail}" for li in facts.lights]
    colors = [item.children[0].className.split("light-")[-1] for item in lights.children]
    assert colors == [li.light for li in facts.lights]
    loss_graph = find(page, "loss-graph")
    if loss_graph is not None and facts.steps:
        markers = [t for t in loss_graph.figure["data"] if str(t.get("name", "")).startswith("spike")]
        assert sorted(x for t in markers for x in t["x"]) == list(facts.loss_spike_steps)

    # trainable and frozen parameter bytes: the facts, info's lines, the report and the memory chart
    if facts.trainable_params_bytes is not None:
        from gpudash.commands.info import summarize as info_lines

        run = load_run(path)
        try:
            info = "\n".join(info_lines(run))
        finally:
            run.close()
        frozen = facts.frozen_params_bytes or 0.0
        assert truth["trainable_params_bytes"] == facts.trainable_params_bytes
        if frozen:
            assert "params (trainable)" in html and "params (frozen)" in html
            names = [t.get("name") for t in find(page, "memory-graph").figure["data"]]
            assert "parameters (trainable)" in names and "parameters (frozen)" in names
        for text in (info, html):
            assert "trainable" in text and "frozen" in text
        from gpudash.units import human_bytes

        assert human_bytes(facts.trainable_params_bytes) in info

    # the trainer's end-of-run lines
    from gpudash.commands.train import summary_lines

    lines = "\n".join(summary_lines(path))
    assert re.search(rf"loss spikes\s+{len(facts.loss_spike_steps)}\b", lines)
    assert re.search(rf"OOMs\s+{facts.oom_count}\b", lines)
    assert re.search(rf"non-finite\s+{len(facts.nonfinite_steps)} step", lines)
    if facts.steps:
        assert re.search(rf"steps\s+{facts.steps},", lines)
    if facts.phases:
        assert f"phases        {', '.join(facts.phases)}" in lines

    _same_rates_everywhere(name, path, facts, truth, page, client, metrics_text, lines, html, report, info_text(path))
    _same_bound_everywhere(facts, truth, page, report, api)
    _same_memory_parts_everywhere(path, facts, page)


def _same_bound_everywhere(facts: Any, truth: dict[str, Any], page: Any, report: dict[str, Any],
                           api: dict[str, Any]) -> None:
    """What bounds the step (issue 35): the throughput header says the summary's bottleneck verdict, in its
    words; no other rule of its own (it once said "input-bound" from the data phase alone)."""
    header = [shown_text(li) for li in find(page, "throughput-stats").children]
    said = [t for t in header if "-bound" in t]
    bound = facts.bound
    if bound is None:
        assert said == [] and truth["bound"] is None
        return
    verdict = next(v for v in report["verdicts"] if v["kind"] == bound.kind)
    assert (verdict["title"], verdict["severity"]) == (bound.title, bound.severity)
    assert verdict["numbers"]["share_of_step"] == pytest.approx(bound.share_of_step)
    assert said == [next(t for t in header if t.startswith(bound.title))]
    assert api["facts"]["bound"]["kind"] == bound.kind
    worse = [v for v in report["verdicts"] if v["kind"].endswith("-bound") and v["severity"] != "ok"]
    assert (bound.kind != "compute-bound") == bool(worse)  # the worst bottleneck, not compute, when there is one


def _ratios(values: list[float]) -> list[float]:
    top = max(values, default=0.0) or 1.0
    return [v / top for v in values]


def _same_memory_parts_everywhere(path: Path, facts: Any, page: Any) -> None:
    """Frozen parameters, the allocator cache and the breakdown at a step (issue 35): derived once
    (analysis.memory_parts); the memory chart, the breakdown at the cursor, the report's chart and the
    facts show the same bytes."""
    from gpudash.analysis.memory_parts import allocator_cache, frozen_params, memory_at
    from gpudash.analysis.ranks import lowest_rank
    from gpudash.analysis.report import report_view

    run = load_run(path)
    try:
        mem = lowest_rank(run.memory)
        figures = report_view(run).figures or ()
    finally:
        run.close()
    if not len(mem):
        return
    rank = int(mem["rank"].min()) if "rank" in mem else 0
    at = memory_at(mem, None, rank)
    bar = find(page, "memory-at-graph").figure["data"]
    if at:  # the breakdown at the cursor (the last step on a finished run's page) is analysis's
        parts = [v for k, v in at.items() if k not in ("step", "peak")]
        assert len(bar[0]["x"]) == len(parts)
        assert _ratios(list(bar[0]["y"])) == pytest.approx(_ratios(parts))
    state = find(page, "live-state").data["specs"]["memory-graph"]
    drawn = {t["name"]: t for t in find(page, "memory-graph").figure["data"]}

    def chart(name: str) -> list[float]:
        spec = next(s for s in state if s["name"] == name)
        return [float(y) * spec["scale"] for y in drawn[name]["y"]]

    last = mem.sort_values("step").ffill().iloc[-1]
    if "allocator cache" in drawn:
        assert at["cache_bytes"] == allocator_cache(float(last["reserved_bytes"]), float(last["allocated_bytes"]))
        assert chart("allocator cache")[-1] == pytest.approx(at["cache_bytes"])
    if facts.frozen_params_bytes:
        assert facts.frozen_params_bytes == frozen_params(facts.peak_bytes["params"], facts.trainable_params_bytes)
        assert chart("parameters (frozen)")[-1] == pytest.approx(at["frozen_params_bytes"])
        memory_fig = next(f for f in figures if f.title == "Memory by category")
        band = next(s for s in memory_fig.series if s.label == "params (frozen)")
        assert float(band.values[-1]) == pytest.approx(at["frozen_params_bytes"])


def info_text(path: Path) -> str:
    from gpudash.commands.info import summarize as info_lines

    run = load_run(path)
    try:
        return "\n".join(info_lines(run))
    finally:
        run.close()


def _same_rates_everywhere(name: str, path: Path, facts: Any, truth: dict[str, Any], page: Any, client: Any,
                           metrics_text: str, trainer: str, html: str, report: dict[str, Any], info: str) -> None:
    """tokens/s and MFU (issue 25): the run page, the runs list, compare, /metrics, info, the report and the
    trainer's last lines state the run's facts (gpudash.analysis.rates), the same number in the same words."""
    from gpudash.analysis.rates import fmt_mfu, fmt_rate
    from gpudash.server.layouts.compare import compare_rows
    from gpudash.server.layouts.runs import runs_table

    head = facts.headline
    tps, mfu = head["tokens_per_s"], head["mfu"]
    assert report["facts"]["headline"]["tokens_per_s"] == truth["headline"]["tokens_per_s"]
    if not facts.steps:
        assert tps is None and mfu is None
        return
    assert tps is not None and tps > 0
    rate = f"{fmt_rate(tps)} tokens/s"
    for where, text in (("info", info), ("report", html), ("trainer", trainer)):
        assert rate in text, where
        assert (f"MFU{' ' * 11}{fmt_mfu(mfu)}" in text or f"MFU</td><td>{fmt_mfu(mfu)}" in text) == (mfu is not None), where
    header = [shown_text(li) for li in find(page, "throughput-stats").children]
    whole = next(t for t in header if t.startswith("whole run: "))
    assert rate in whole and (f"MFU {fmt_mfu(mfu)}" if mfu is not None else "MFU: device peak unknown") in whole
    recent = facts.recent
    if recent.tokens_per_s is not None:
        assert any(f"{fmt_rate(recent.tokens_per_s)} tokens/s" in t and f"(last {recent.steps} steps)" in t
                   for t in header)
    # the runs list: the API's row, and the table's cells
    row = next(r for r in client.get("/api/runs?per_page=1000").get_json()["runs"] if r["id"] == name)
    if row.get("pending"):  # a cold list shows a run from its metadata until the background summarised it
        from gpudash.server.background import summariser

        assert summariser().wait(120)
        row = next(r for r in client.get("/api/runs?per_page=1000").get_json()["runs"] if r["id"] == name)
    assert (row["tokens_per_s"], row["mfu"]) == (truth["headline"]["tokens_per_s"], truth["headline"]["mfu"])
    cells = [shown_text(td) for tr in find(runs_table(path.parent, [row]), "runs-table").children[1].children
             for td in tr.children]
    assert fmt_rate(tps) in cells and fmt_mfu(mfu) in cells
    # compare: the table's row for this run
    crow = compare_rows([(name, None)], [facts])[0]
    assert (crow["tokens/s"], crow["MFU"]) == (fmt_rate(tps), fmt_mfu(mfu))
    # /metrics: the run's gauges are the facts; a one-rank run's recent gauge is the facts' recent rate
    assert _metric(metrics_text, "gpudash_run_tokens_per_second", name) == pytest.approx(tps)
    got_mfu = _metric(metrics_text, "gpudash_run_mfu_ratio", name)
    assert (got_mfu is None) if mfu is None else got_mfu == pytest.approx(mfu)
    if facts.ranks == 1 and recent.tokens_per_s is not None:
        assert _metric(metrics_text, "gpudash_tokens_per_second", name, rank="0") == pytest.approx(recent.tokens_per_s)
        recent_mfu = _metric(metrics_text, "gpudash_mfu_ratio", name)
        assert (recent_mfu is None) if recent.mfu is None else recent_mfu == pytest.approx(recent.mfu)


def test_the_hand_made_runs_say_what_happened(runs_dir: Path) -> None:
    def facts(name: str) -> Any:
        return shared_cache().get(runs_dir / name).facts

    f = facts("spikes")
    assert f.loss_spike_steps == (150, 220)  # +30 % and x2 are spikes, +10 % is not
    assert f.phases == ("data", "forward", "eval")  # eval was opened; eval_time_s / ckpt_total_s were logged
    assert f.light("loss spikes") is not None and f.light("loss spikes").light == "amber"  # type: ignore[union-attr]
    f = facts("nan-steps")
    assert f.nonfinite_steps == (20, 21, 30) and f.loss_spike_steps == ()
    assert [facts(n).light("fragmentation").light for n in ("frag-25", "frag-35")] == ["green", "amber"]  # type: ignore[union-attr]
    assert facts("frag-35").fragmentation_pct == pytest.approx(35.0)
    assert facts("sparse-activations").peak_bytes["activations"] == 5000 + 255
    assert facts("oom-twice-recorded").oom_count == 2  # step 40 recorded twice (one OOM), step 90 once
    f = facts("lora")
    assert (f.trainable_params_bytes, f.frozen_params_bytes, f.peak_bytes["params"]) == (100, 900, 1000)


def test_the_rates_runs_say_what_happened(runs_dir: Path) -> None:
    f = shared_cache().get(runs_dir / "mfu").facts
    tps, mfu = f.headline["tokens_per_s"], f.headline["mfu"]
    assert mfu == pytest.approx(tps * MFU_CONFIG["flops_per_token"] / MFU_CONFIG["peak_flops"])
    assert f.recent.mfu == pytest.approx(f.recent.tokens_per_s * 6e6 / 1e12)
    assert shared_cache().get(runs_dir / "spikes").facts.headline["mfu"] is None  # no peak known: no MFU
    # 13 pauses of 10 ms between steps: wall time, so the rate is below tokens over the summed step times
    g = shared_cache().get(runs_dir / "gaps")
    steps = g.run.steps
    assert g.facts.headline["tokens_per_s"] < float(steps["tokens"].sum()) / float(steps["duration_s"].sum()) * 0.9


def test_fragmentation_verdict_follows_the_light(runs_dir: Path) -> None:
    kinds = {n: {v.kind for v in shared_cache().get(runs_dir / n).verdicts()} for n in ("frag-25", "frag-35")}
    assert "fragmentation" not in kinds["frag-25"] and "fragmentation" in kinds["frag-35"]


def test_sparse_activations_never_vanish_from_metrics(runs_dir: Path, metrics_text: str) -> None:
    # the last rows of the run carry no activations_bytes: the gauge is the last value, carried forward
    assert _metric(metrics_text, "gpudash_memory_category_bytes", "sparse-activations", category="activations") \
        == 5000 + 255


def test_finished_runs_stay_in_metrics(metrics_text: str) -> None:
    for name in SAMPLES:  # finished long ago: still scraped (no --metrics-max-age)
        assert _metric(metrics_text, "gpudash_steps", name) is not None, name


def test_metrics_max_age_drops_runs_that_ended_long_ago(runs_dir: Path) -> None:
    from prometheus_client import generate_latest

    from gpudash.server.metrics import main, metrics_registry

    text = generate_latest(metrics_registry(runs_dir / "healthy", max_age_s=60.0)).decode()
    assert "gpudash_step{" not in text  # the sample run ended long before this test
    assert main([str(runs_dir), "--metrics-max-age", "-1"]) == 2  # a user mistake: one line, no traceback


def test_spike_markers_of_a_downsampled_view_are_the_facts() -> None:
    """A long run's chart is drawn from a downsampled frame, where the trailing window of a row spans many
    more steps: judged there, the spikes vanished. The markers are the run's facts, judged on every row."""
    import numpy as np
    import pandas as pd

    from gpudash.server.layouts.data import RunView, downsample_frame
    from gpudash.server.layouts.run_page import build_graph
    from gpudash.store.run import Run

    n = 3000
    rng = np.random.default_rng(0)
    loss = np.linspace(6.0, 2.0, n) + 0.01 * rng.standard_normal(n)
    loss[2000] *= 1.25
    loss[2500] *= 1.5
    steps = pd.DataFrame({"step": np.arange(n), "rank": 0, "loss": loss, "duration_s": 0.1, "time": np.arange(n) * 0.1})
    facts = run_facts(Run(path=Path("."), meta={}, status="finished", steps=steps, memory=pd.DataFrame(),
                          events=pd.DataFrame()))
    assert facts.loss_spike_steps == (2000, 2500)
    view = RunView(path=Path("."), meta={}, status="finished", frames={"steps": downsample_frame(steps, "steps", 300)})
    assert len(view.frame("steps")) < n
    fig, _ = build_graph("loss-graph", view, spikes=list(facts.loss_spike_steps))
    assert next(t for t in fig.data if t.name == "spike").x == [2000, 2500]
