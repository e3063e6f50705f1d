"""The alert rules (rows in, alerts out), their episodes and cooldown, and alerts read back from a run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpudash.analysis.alerts import EPISODE_GAP_STEPS, Alert, AlertGate, evaluate, recorded_alerts
from gpudash.options import AlertOptions, MonitorOptions, alert_options
from gpudash.store.run import Run

T0 = 1_700_000_000.0


def _run(steps: pd.DataFrame | None = None, memory: pd.DataFrame | None = None, events: pd.DataFrame | None = None,
         status: str = "live", meta: dict[str, Any] | None = None, ranks: int = 1) -> Run:
    return Run(path=Path("r"), meta=dict(meta or {}), status=status,
               steps=steps if steps is not None else pd.DataFrame(columns=["rank", "step", "time", "duration_s"]),
               memory=memory if memory is not None else pd.DataFrame(columns=["rank", "step", "time"]),
               events=events if events is not None else pd.DataFrame(columns=["rank", "time", "step", "kind",
                                                                             "message", "data"]),
               rank_meta={r: {} for r in range(ranks)})


def _steps(n: int, loss: Any = None, rank: int = 0, dt: float = 0.1, t0: float = T0) -> pd.DataFrame:
    d: dict[str, Any] = {"rank": rank, "step": range(n), "time": [t0 + dt * (i + 1) for i in range(n)],
                         "duration_s": dt}
    d["loss"] = [2.0 + 0.004 * math.sin(1.3 * i) for i in range(n)] if loss is None else loss
    return pd.DataFrame(d)


def _kinds(alerts: list[Alert]) -> list[str]:
    return [a.kind for a in alerts]


def test_a_nan_loss_is_a_nonfinite_alert_at_its_step() -> None:
    s = _steps(40)
    s.loc[25, "loss"] = None  # NaN is stored as NULL
    found = evaluate(_run(s), now=T0 + 4.1)
    assert [(a.kind, a.step) for a in found] == [("nonfinite", 25)]
    assert "step 25" in found[0].text


def test_a_spike_is_the_one_spike_rule() -> None:
    from gpudash.analysis.stability import loss_spikes

    s = _steps(80)
    s.loc[70, "loss"] = 9.0
    run = _run(s)
    found = evaluate(run, now=T0 + 8.1)
    assert [a.step for a in found if a.kind == "loss_spike"] == loss_spikes(run) == [70]


def test_a_spike_too_close_to_a_cut_window_start_is_left_to_earlier_looks() -> None:
    s = _steps(80)
    s.loc[20, "loss"] = 9.0
    assert [a.step for a in evaluate(_run(s), now=T0 + 8.1) if a.kind == "loss_spike"] == [20]
    assert [a.step for a in evaluate(_run(s), now=T0 + 8.1, complete=False) if a.kind == "loss_spike"] == []


def test_oom_alert_carries_the_forensics_line() -> None:
    ev = pd.DataFrame({"rank": [0], "time": [T0 + 1], "step": [12], "kind": ["oom"],
                       "message": ["CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                   "23.65 GiB of which 1.00 GiB is free."], "data": [{}]})
    found = evaluate(_run(_steps(13), events=ev), now=T0 + 1.4)
    oom = [a for a in found if a.kind == "oom"]
    assert len(oom) == 1 and oom[0].step == 12
    assert oom[0].text.startswith("CUDA out of memory at step 12: ") and oom[0].data["verdict"]


def test_stall_after_n_times_the_recent_step_period() -> None:
    s = _steps(30, dt=1.0)  # last step at T0 + 30
    opts = {"stall_factor": 10.0, "stall_min_s": 5.0}
    assert not [a for a in evaluate(_run(s), now=T0 + 39.0, **opts) if a.kind == "stall"]
    stall = [a for a in evaluate(_run(s), now=T0 + 41.0, **opts) if a.kind == "stall"]
    assert len(stall) == 1 and stall[0].step == 29 and "no step for 11 s" in stall[0].text
    assert not [a for a in evaluate(_run(s, status="finished"), now=T0 + 99.0, **opts) if a.kind == "stall"]
    # the floor: a fast loop is not stalled after a fraction of a second
    fast = _steps(30, dt=0.01)
    assert not [a for a in evaluate(_run(fast), now=T0 + 2.0, stall_factor=10, stall_min_s=5) if a.kind == "stall"]


def test_headroom_under_the_threshold_on_the_card() -> None:
    gib = 2**30
    mem = pd.DataFrame({"rank": 0, "step": [0, 1, 2], "time": T0, "peak_bytes": [18 * gib, 19 * gib, 19.5 * gib],
                        "device_total_bytes": 20 * gib})
    found = [a for a in evaluate(_run(_steps(3), memory=mem), now=T0, headroom_pct=5.0) if a.kind == "headroom"]
    assert len(found) == 1 and found[0].step == 2 and "2.5 % headroom" in found[0].text
    assert not [a for a in evaluate(_run(_steps(3), memory=mem), now=T0, headroom_pct=2.0) if a.kind == "headroom"]


def test_allocator_retries_alert_where_the_counter_rises() -> None:
    mem = pd.DataFrame({"rank": 0, "step": range(6), "time": T0, "alloc_retries": [0, 0, 0, 2, 2, 3]})
    found = [a for a in evaluate(_run(_steps(6), memory=mem), now=T0) if a.kind == "alloc_retries"]
    assert [a.step for a in found] == [3, 5]


def test_straggler_rank_from_the_ranks_rule() -> None:
    frames = [_steps(40, rank=r, dt=0.1) for r in range(4)]
    s = pd.concat(frames, ignore_index=True)
    s.loc[s["rank"] == 3, "duration_s"] = 0.2
    found = [a for a in evaluate(_run(s, ranks=4), now=T0 + 4) if a.kind == "straggler"]
    assert [a.rank for a in found] == [3]


def test_precision_fallback_and_crash() -> None:
    ev = pd.DataFrame({"rank": [0], "time": [T0 + 1], "step": [7], "kind": ["precision_fallback"],
                       "message": ["fp16 -> fp32 after 3 non-finite steps"], "data": [{}]})
    found = evaluate(_run(_steps(10), events=ev, status="crashed", meta={"end_reason": "exception: RuntimeError: x"}),
                     now=T0 + 2)
    assert _kinds(found) == ["precision_fallback", "crashed"]
    assert found[1].text == "run crashed after step 9: exception: RuntimeError: x"
    # Ctrl-C at the terminal is nobody's news
    assert not evaluate(_run(_steps(10), status="crashed", meta={"end_reason": "KeyboardInterrupt"}), now=T0)


def test_kinds_choose_what_alerts() -> None:
    s = _steps(40)
    s.loc[25, "loss"] = None
    assert evaluate(_run(s), now=T0 + 4.1, kinds=("oom",)) == []


# ---- episodes and cooldown -------------------------------------------------------------------------------
def _nan(step: int) -> Alert:
    return Alert("nonfinite", f"nan at {step}", step=step)


def test_one_alert_per_episode_and_a_window_seen_twice_is_not_new() -> None:
    gate = AlertGate(cooldown_s=0)
    assert _kinds(gate.admit([_nan(10)], now=1)) == ["nonfinite"]
    assert gate.admit([_nan(10), _nan(11), _nan(12)], now=2) == []  # same episode, seen again
    assert gate.admit([_nan(10 + 2 + EPISODE_GAP_STEPS)], now=3) == []  # within the gap: still the episode
    assert [a.step for a in gate.admit([_nan(100)], now=4)] == [100]  # a new episode


def test_cooldown_counts_a_new_episode_instead_of_sending_it() -> None:
    gate = AlertGate(cooldown_s=60)
    assert gate.admit([_nan(10)], now=0)
    assert gate.admit([_nan(100)], now=30) == [] and gate.suppressed == 1
    assert gate.admit([_nan(200)], now=61)
    # another kind is not cooled by this one
    assert gate.admit([Alert("oom", "x", step=201)], now=62)


def test_state_kinds_alert_when_they_begin_and_again_only_after_they_cleared() -> None:
    gate = AlertGate(cooldown_s=0)
    head = Alert("headroom", "low", step=5)
    assert gate.admit([head], now=0)
    assert gate.admit([Alert("headroom", "low", step=6)], now=1) == []
    assert gate.admit([], now=2) == []  # cleared
    assert gate.admit([Alert("headroom", "low", step=9)], now=3)


def test_quiet_look_takes_note_without_sending() -> None:
    gate = AlertGate(cooldown_s=0)
    assert gate.admit([_nan(3), Alert("headroom", "low", step=3)], now=0, quiet=True) == []
    assert gate.admit([_nan(3), _nan(4), Alert("headroom", "low", step=4)], now=1) == []


def test_gate_memory_is_bounded() -> None:
    gate = AlertGate(cooldown_s=0, remember=50)
    for s in range(0, 5000, 20):
        gate.admit([_nan(s)], now=s)
    assert len(gate._seen) <= 50


# ---- read back ----------------------------------------------------------------------------------------
def test_recorded_alerts_read_the_alert_events() -> None:
    ev = pd.DataFrame({"rank": [0, 0], "time": [T0 + 2, T0 + 1], "step": [9, 4], "kind": ["alert", "oom"],
                       "message": ["loss is non-finite (NaN/Inf) at step 9", "CUDA out of memory"],
                       "data": [{"alert": "nonfinite", "rank": 1}, {}]})
    got = recorded_alerts(_run(events=ev))
    assert [(a.kind, a.step, a.rank, a.text) for a in got] == [("nonfinite", 9, 1,
                                                                 "loss is non-finite (NaN/Inf) at step 9")]


# ---- the options --------------------------------------------------------------------------------------
def test_alert_options_validate_in_one_line() -> None:
    assert alert_options("https://hooks.example/x") == AlertOptions(webhook="https://hooks.example/x")
    assert alert_options(True) == AlertOptions()
    assert alert_options(None) is None and alert_options(False) is None
    assert MonitorOptions(alerts={"cooldown_s": 5}).alerts == AlertOptions(cooldown_s=5)
    for bad in ("ftp://x/y", "file:///etc/passwd", "http://", "not a url", "http://a b/"):
        with pytest.raises(ValueError, match="http:// or https://"):
            AlertOptions(webhook=bad)
    with pytest.raises(ValueError, match="unknown alert kind"):
        AlertOptions(kinds=("nan",))
    with pytest.raises(ValueError, match="bad alert option"):
        MonitorOptions(alerts={"hook": "x"})
    with pytest.raises(ValueError, match="headroom_pct"):
        AlertOptions(headroom_pct=120)


# ---- one truth: the run page and the report show the alerts the run recorded ----------------------------
def test_recorded_alerts_on_the_run_page_and_in_the_report(tmp_path: Path) -> None:
    import time

    from gpudash.monitor import Monitor
    from gpudash.report import render_html, render_markdown
    from gpudash.server.layouts.events import event_rows, events_figure
    from gpudash.store import load_run

    with Monitor(tmp_path / "r", host_hz=0, handle_signals=False,
                 alerts=AlertOptions(desktop=False, terminal=False)) as mon:
        for i in range(30):
            with mon.step():
                mon.log(loss=float("nan") if i == 20 else 2.0)
        time.sleep(1.2)  # a look while live; the last look at close() would also find it
    run = load_run(tmp_path / "r")
    alerts = recorded_alerts(run)
    assert [(a.kind, a.step) for a in alerts] == [("nonfinite", 20)]
    text = alerts[0].text
    rows = [r for r in event_rows(run.events) if r["kind"] == "alert"]
    assert [(r["step"], r["message"]) for r in rows] == [(20, text)]
    traces = events_figure(run.events)["data"]  # the events timeline's markers
    assert any(t.get("name") == "alert" and t["x"] == [20.0] for t in traces)
    html = render_html(run)
    assert '<ul id="alerts"><li>step 20: <b>nonfinite</b>: ' + text + "</li></ul>" in html
    assert f"- step 20: **nonfinite**: {text}" in render_markdown(run)
    run.close()


# ---- triggers: when a live look runs every rule ------------------------------------------------------------
def _cols(**c: Any) -> dict[str, Any]:
    import numpy as np

    return {k: np.asarray(v, dtype=float) for k, v in c.items()}


def test_triggers_fire_on_what_the_rules_could_find_and_not_on_a_flat_loss() -> None:
    from gpudash.analysis.alerts import Triggers

    t = Triggers()
    flat = [2.0 + 0.004 * math.sin(1.3 * i) for i in range(60)]
    assert not t.fire(_cols(rank=[0] * 60, loss=flat), {}, 5.0)
    assert t.fire(_cols(rank=[0], loss=[float("nan")]), {}, 5.0)  # non-finite
    assert t.fire(_cols(rank=[0], loss=[9.0]), {}, 5.0)  # the spike rule on the trailing losses
    assert not t.fire(_cols(rank=[0], loss=[2.0]), {}, 5.0)
    assert t.fire(_cols(rank=[0], skipped=[1.0]), {}, 5.0)
    assert not t.fire({}, _cols(rank=[0, 0], alloc_retries=[2, 2]), 5.0)
    assert t.fire({}, _cols(rank=[0], alloc_retries=[3]), 5.0)  # the counter rose
    assert not t.fire({}, _cols(rank=[0], peak_bytes=[19.5 * 2**30]), 5.0)  # capacity not known yet
    t.capacity = 20 * 2**30
    assert t.fire({}, _cols(rank=[0], peak_bytes=[19.5 * 2**30]), 5.0)
    assert not t.fire({}, _cols(rank=[0], peak_bytes=[10 * 2**30]), 5.0)


def test_a_quiet_look_runs_no_rule_and_a_nan_runs_them_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpudash.alerts.watch as watch_mod
    from gpudash.monitor import Monitor

    calls: list[tuple[str, ...]] = []
    real = watch_mod.evaluate

    def counted(*a: Any, **k: Any) -> list[Alert]:
        calls.append(tuple(k.get("kinds", ())))
        return real(*a, **k)

    monkeypatch.setattr(watch_mod, "evaluate", counted)
    with Monitor(tmp_path / "r", host_hz=0, handle_signals=False, flush_interval=0.05) as mon:
        w = watch_mod.RunWatch(tmp_path / "r", AlertOptions(terminal=False, desktop=False))
        for step in range(60):
            with mon.step():
                mon.log(loss=2.0 + 0.004 * math.sin(1.3 * step))
            if step % 10 == 9:
                mon.flush()
                w.look()
        assert len(calls) == 1  # the first look runs every rule; the quiet ones after it none
        with mon.step():
            mon.log(loss=float("nan"))
        mon.flush()
        assert [a.kind for a in w.look()] == ["nonfinite"]
        assert len(calls) == 2
        w.close()
