"""Energy from recorded rows: the NVML counter, power integrated where it is missing, busy vs idle, RAPL once
per machine, and every surface (info, report, JSON, check) showing the one fact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudash.analysis.energy import energy_text, interval_energy, run_energy
from gpudash.store.run import Run


def _run(steps: pd.DataFrame, device: pd.DataFrame | None = None, host: pd.DataFrame | None = None,
         rank_meta: dict[int, dict[str, object]] | None = None) -> Run:
    r = Run(path=Path("x"), meta={}, status="finished", steps=steps, memory=pd.DataFrame(), events=pd.DataFrame(),
            rank_meta=rank_meta or {})
    r.__dict__["device"] = device if device is not None else pd.DataFrame()
    r.__dict__["host"] = host if host is not None else pd.DataFrame()
    return r


T = np.arange(11.0)  # samples at 0..10 s
# five steps of 1 s inside [2, 7], 1,000 tokens each
STEPS = pd.DataFrame({"step": range(5), "time": np.arange(3.0, 8.0), "duration_s": 1.0, "tokens": 1000.0, "rank": 0})


def test_counter_split_into_busy_and_idle_and_rates() -> None:
    dev = pd.DataFrame({"time": T, "gpu": 0, "rank": 0, "energy_j": 100.0 * T, "power_w": 999.0})
    e = run_energy(_run(STEPS, dev), 5)
    assert e is not None and e.gpu_source == "NVML energy counter"  # the counter wins over power
    assert (e.total_j, e.busy_j, e.idle_j) == pytest.approx((1000.0, 500.0, 500.0))
    assert e.j_per_step == pytest.approx(100.0)
    assert e.wh_per_mtok == pytest.approx(500.0 / 3600.0 / 0.005)
    assert e.kwh == pytest.approx(1000.0 / 3.6e6)
    assert e.cpu_j is None and "J/step" in energy_text(e)


def test_power_integrated_where_the_counter_is_missing_and_a_reset_adds_nothing() -> None:
    counter = 100.0 * T
    counter[6:] -= 10_000.0  # the counter went back once (driver reload)
    dev = pd.concat([pd.DataFrame({"time": T, "gpu": 0, "rank": 0, "energy_j": counter}),
                     pd.DataFrame({"time": T, "gpu": 1, "rank": 0, "power_w": 50.0})])
    e = run_energy(_run(STEPS, dev), 5)
    assert e is not None and e.gpu_source == "NVML energy counter and power integrated"
    assert e.per_gpu_j == pytest.approx({"rank 0 GPU 0": 900.0, "rank 0 GPU 1": 500.0})
    assert interval_energy(np.array([0.0]), None, np.array([1.0])) is None


def test_rapl_counted_once_per_machine_and_none_without_a_source() -> None:
    host = pd.concat([pd.DataFrame({"time": T, "rank": r, "cpu_energy_j": 20.0 * T}) for r in (0, 1)])
    same = {0: {"node": "a"}, 1: {"node": "a"}}
    e = run_energy(_run(STEPS, host=host, rank_meta=same), 5)
    assert e is not None and e.cpu_j == pytest.approx(200.0) and e.gpu_j is None
    two = run_energy(_run(STEPS, host=host, rank_meta={0: {"node": "a"}, 1: {"node": "b"}}), 5)
    assert two is not None and two.cpu_j == pytest.approx(400.0)
    assert run_energy(_run(STEPS), 5) is None


def test_every_surface_shows_the_recorded_energy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from gpudash.cli import main
    from gpudash.monitor import Monitor

    with Monitor(tmp_path / "e", host_hz=0, handle_signals=False, flush_interval=0.05) as mon:
        t0 = time.time()
        mon.recorder.put("device", {"time": t0, "gpu": 0, "energy_j": 0.0})
        time.sleep(0.1)  # start-up: idle
        for _ in range(6):  # two samples inside each step, at 100 W: the interval between them is busy (one
            # sample a step put every interval's midpoint at a step boundary, busy or idle by a few µs of timing)
            with mon.step(tokens=2000):
                for _ in range(2):
                    time.sleep(0.005)
                    t = time.time()
                    mon.recorder.put("device", {"time": t, "gpu": 0, "energy_j": 100.0 * (t - t0)})
                time.sleep(0.005)
    main(["info", str(tmp_path / "e"), "--json"])
    energy = json.loads(capsys.readouterr().out)["facts"]["energy"]
    wh = energy["wh_per_mtok"]
    assert energy["total_j"] > energy["busy_j"] > 0 and wh > 0 and energy["steps"] == 6
    main(["info", str(tmp_path / "e")])
    assert f"{wh:.3g} Wh per million tokens" in capsys.readouterr().out
    main(["report", str(tmp_path / "e"), "--format", "md", "-o", str(tmp_path / "r.md")])
    assert f"{wh:.3g} Wh per million tokens" in (tmp_path / "r.md").read_text()
    assert main(["check", str(tmp_path / "e"), "--max-wh-per-mtok", str(wh * 2)]) == 0
    assert main(["check", str(tmp_path / "e"), "--max-wh-per-mtok", str(wh / 2)]) == 1
    assert "Wh per million tokens" in capsys.readouterr().out
    from prometheus_client import generate_latest

    from gpudash.server.metrics import metrics_registry

    text = generate_latest(metrics_registry(tmp_path)).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("gpudash_run_energy_per_mtok_wh{"))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(wh)
    assert "gpudash_run_energy_joules_total{" in text


def test_the_run_page_throughput_lines_state_the_energy() -> None:
    from gpudash.analysis.facts import run_facts
    from gpudash.server.layouts.throughput import stats_lines

    dev = pd.DataFrame({"time": T, "gpu": 0, "rank": 0, "energy_j": 100.0 * T})
    facts = run_facts(_run(STEPS, dev))
    assert facts.energy is not None
    assert f"energy: {energy_text(facts.energy)}" in stats_lines(facts)


def test_a_cpu_run_without_rapl_says_so_once() -> None:
    from gpudash.analysis.facts import headline_rows, run_facts

    run = _run(STEPS)
    run.meta["unavailable_cpu_energy"] = "no RAPL counters (/sys/class/powercap not readable)"
    assert dict(headline_rows(run_facts(run), run.meta))["energy"] == \
        "not measured (no RAPL counters (/sys/class/powercap not readable))"


def test_per_gpu_and_per_rank_from_rows_of_several_gpus_and_ranks() -> None:
    steps = pd.concat([STEPS.assign(rank=r) for r in (0, 1)])
    dev = pd.concat([pd.DataFrame({"time": T, "gpu": g, "rank": r, "energy_j": w * T})
                     for r, g, w in ((0, 0, 100.0), (0, 1, 120.0), (1, 0, 80.0), (1, 1, 90.0))])
    host = pd.concat([pd.DataFrame({"time": T, "rank": r, "cpu_energy_j": 20.0 * T}) for r in (0, 1)])
    e = run_energy(_run(steps, dev, host, rank_meta={0: {"node": "a"}, 1: {"node": "a"}}), 5)
    assert e is not None
    assert e.per_gpu_j == pytest.approx({"rank 0 GPU 0": 1000.0, "rank 0 GPU 1": 1200.0, "rank 1 GPU 0": 800.0,
                                         "rank 1 GPU 1": 900.0})
    # the machine's CPU packages once, with the rank whose samples were counted
    assert e.per_rank_j == pytest.approx({"rank 0": 2200.0 + 200.0, "rank 1": 1700.0})
    assert e.total_j == pytest.approx(sum(e.per_rank_j.values()))
    text = energy_text(e)
    assert "per GPU: rank 0 GPU 1 1.2e+03 J, rank 0 GPU 0 1e+03 J, rank 1 GPU 1 900 J, rank 1 GPU 0 800 J" in text
    assert "per rank: rank 0 2.4e+03 J, rank 1 1.7e+03 J" in text
    one = run_energy(_run(STEPS, dev[(dev["rank"] == 0) & (dev["gpu"] == 0)]), 5)
    assert one is not None and "per GPU" not in energy_text(one) and "per rank" not in energy_text(one)


def test_every_surface_shows_energy_per_gpu_and_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two ranks of two GPUs each, their device rows recorded as the NVML collector writes them: info, the
    report and /metrics (labels rank and gpu) show each GPU's and each rank's energy. No memory rows: a two-rank
    run without them is scraped too."""
    import time

    from prometheus_client import generate_latest

    from gpudash.cli import main
    from gpudash.monitor import Monitor
    from gpudash.server.metrics import metrics_registry

    mons = [Monitor(tmp_path / "e", rank=r, world_size=2, host_hz=0, handle_signals=False, flush_interval=0.05)
            for r in (0, 1)]
    t0 = time.time()
    for step in range(5):
        for r, mon in enumerate(mons):
            with mon.step(tokens=1000):
                time.sleep(0.005)
                for g in (0, 1):
                    mon.recorder.put("device", {"time": t0 + step, "gpu": g, "energy_j": (100 + 10 * g + 50 * r) * step})
    for mon in mons:
        mon.close()
    main(["info", str(tmp_path / "e"), "--json"])
    energy = json.loads(capsys.readouterr().out)["facts"]["energy"]
    assert energy["per_gpu_j"] == pytest.approx({"rank 0 GPU 0": 400.0, "rank 0 GPU 1": 440.0,
                                                 "rank 1 GPU 0": 600.0, "rank 1 GPU 1": 640.0})
    assert energy["per_rank_j"] == pytest.approx({"rank 0": 840.0, "rank 1": 1240.0})
    main(["info", str(tmp_path / "e")])
    out = capsys.readouterr().out
    assert "per GPU: rank 1 GPU 1 640 J" in out and "per rank: rank 1 1.24e+03 J, rank 0 840 J" in out
    main(["report", str(tmp_path / "e"), "--format", "md", "-o", str(tmp_path / "r.md")])
    assert "per GPU: rank 1 GPU 1 640 J" in (tmp_path / "r.md").read_text()
    from gpudash import load_run
    from gpudash.analysis.summary import summarize

    cost = next(v for v in summarize(load_run(tmp_path / "e")) if v.kind == "cost")  # the energy beside the money
    assert any("per rank: rank 1 1.24e+03 J, rank 0 840 J" in line for line in cost.evidence), cost.evidence
    text = generate_latest(metrics_registry(tmp_path)).decode()
    got = {ln.split("{")[1].split("}")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
           if ln.startswith("gpudash_run_gpu_energy_joules_total{")}
    assert len(got) == 4 and any('rank="1"' in k and 'gpu="1"' in k and v == pytest.approx(640.0)
                                 for k, v in got.items()), got
    ranks = [ln for ln in text.splitlines() if ln.startswith("gpudash_run_rank_energy_joules_total{")]
    assert len(ranks) == 2 and any('rank="1"' in ln and ln.endswith(" 1240.0") for ln in ranks), ranks
