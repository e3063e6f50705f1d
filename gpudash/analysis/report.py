"""The post-mortem report's view model: every fact the report shows, derived once from a run.

:func:`report_view` gathers what ``gpudash report`` prints (the headline rows, what to change, the
alerts, the verdicts, the figures' series and markers) from :mod:`gpudash.analysis`'s functions;
the renderers in :mod:`gpudash.report` (HTML from Jinja2 templates with inline SVG, Markdown) only
format it. Nothing here writes HTML or Markdown. ``report_json`` is ``--format json``'s document.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.alerts import Alert, recorded_alerts
from gpudash.analysis.capacity import capacity_bytes
from gpudash.analysis.cost import DEFAULT_PRICE_PER_HOUR, on_gpu
from gpudash.analysis.facts import Facts, headline_rows, json_safe, run_facts
from gpudash.analysis.memory_parts import frozen_params
from gpudash.analysis.oom import CATEGORIES
from gpudash.analysis.phases import phase_columns
from gpudash.analysis.ranks import lowest_rank
from gpudash.analysis.summary import summarize
from gpudash.analysis.verdict import Verdict
from gpudash.store.run import Run
from gpudash.units import human_bytes

__all__ = ["MARKED_EVENTS", "MAX_ITEMS", "Figure", "Marker", "ReportView", "Series", "headline", "report_json",
           "report_view"]

#: Event kinds the figures mark at their step (loss spikes are marked from the facts, kind ``loss-spike``).
MARKED_EVENTS = ("oom", "precision_fallback", "nan", "alert")
#: At most this many markers on the figures and alerts in the list (a report shows a shape, not every event).
MAX_ITEMS = 200
#: GPU activity columns in the order the figure draws them.
DEVICE_ACTIVITY = ("sm_active_pct", "gpu_util_pct", "sm_occupancy_pct", "tensor_active_pct")


@dataclass(frozen=True)
class Marker:
    """A vertical line on every figure: something that happened at ``step``."""

    step: float
    kind: str
    """``loss-spike`` or one of :data:`MARKED_EVENTS`."""
    label: str


@dataclass(frozen=True, eq=False)
class Series:
    """One line (or band of a stacked chart). ``tone``: the palette slot the renderer colours it with,
    or a named tone (``rest``: time outside the phases, ``frozen``: frozen parameters)."""

    label: str
    values: np.ndarray
    tone: int | str


@dataclass(frozen=True, eq=False)
class Figure:
    """One chart: ``x`` are step numbers; ``y_fmt`` is ``num``, ``bytes`` or ``s``; ``hline`` a
    (value, label) line across it (the device's capacity)."""

    title: str
    x: np.ndarray
    series: tuple[Series, ...]
    y_title: str
    y_fmt: str = "num"
    stacked: bool = False
    y_zero: bool | None = None
    legend: bool = True
    hline: tuple[float, str] | None = None


@dataclass(frozen=True)
class ReportView:
    """What the report shows, in the order it shows it."""

    name: str
    path: str
    lead: str
    """The worst finding's title, or that nothing wrong was found."""
    headline: tuple[tuple[str, str], ...]
    """(label, text) rows: :func:`gpudash.analysis.facts.headline_rows` and the damaged parts."""
    actions: tuple[Verdict, ...]
    """The verdicts with something to change, worst first."""
    alerts: tuple[Alert, ...]
    verdicts: tuple[Verdict, ...]
    on_gpu: bool
    price_per_hour: float
    generated_at: float
    """When the report was made (seconds since the epoch)."""
    figures: tuple[Figure, ...] | None = None
    """None when not derived (``report_view(..., figures=False)``); empty when the run has nothing to draw."""
    markers: tuple[Marker, ...] = ()

    @property
    def title(self) -> str:
        return f"gpudash report: {self.name}"


def headline(run: Run, facts: Facts | None = None) -> list[tuple[str, str]]:
    """Key facts as (label, value) rows (:func:`gpudash.analysis.facts.headline_rows`) and the damaged parts."""
    rows = headline_rows(facts if facts is not None else run_facts(run), run.meta)
    rows += [("damaged", p) for p in run.problems]
    return rows


def report_view(run: Run, verdicts: list[Verdict] | None = None, price_per_hour: float = DEFAULT_PRICE_PER_HOUR,
                *, figures: bool = True) -> ReportView:
    """The report of ``run``. ``verdicts``: :func:`summarize`'s, when the caller has them already;
    ``figures=False`` skips the charts' series (the Markdown report has none)."""
    if verdicts is None:
        verdicts = summarize(run, price_per_hour=price_per_hour)
    facts = run_facts(run)
    worst = next((v for v in verdicts if v.severity != "ok"), None)
    figs: tuple[Figure, ...] | None = None
    markers: tuple[Marker, ...] = ()
    if figures:
        markers = tuple(_markers(run, facts))
        figs = tuple(_figures(run, capacity_bytes(run), facts))
    return ReportView(
        name=str(run.name), path=str(run.path), lead=worst.title if worst else "Nothing wrong found.",
        headline=tuple(headline(run, facts)),
        actions=tuple(v for v in verdicts if v.recommendation and v.severity != "ok"),
        alerts=tuple(recorded_alerts(run)[:MAX_ITEMS]), verdicts=tuple(verdicts), on_gpu=on_gpu(run),
        price_per_hour=price_per_hour, generated_at=time.time(), figures=figs, markers=markers)


def report_json(run: Run, verdicts: list[Verdict] | None = None, facts: Facts | None = None,
                price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> dict[str, Any]:
    """``{"facts": {...}, "verdicts": [...]}``: what ``gpudash report --format json`` prints (JSON-safe)."""
    if verdicts is None:
        verdicts = summarize(run, price_per_hour=price_per_hour)
    facts = facts if facts is not None else run_facts(run)
    return {"facts": facts.to_json(), "verdicts": json_safe([v.as_dict() for v in verdicts])}


# ---- the figures ------------------------------------------------------------------------------------
def _markers(run: Run, facts: Facts) -> list[Marker]:
    """Event markers; loss spikes are the run's facts (the trainer's live events follow the same rule)."""
    out = [Marker(float(s), "loss-spike", f"step {s}: loss spike") for s in facts.loss_spike_steps]
    ev = run.events
    if not ev.empty:
        for _, e in ev.iterrows():
            kind = str(e["kind"])
            if kind in MARKED_EVENTS and not pd.isna(e["step"]):
                out.append(Marker(float(e["step"]), kind, f"step {int(e['step'])}: {kind}: {e['message']}"))
    return sorted(out, key=lambda m: (m.step, m.kind, m.label))[:MAX_ITEMS]


def _one_rank(df: pd.DataFrame) -> pd.DataFrame:
    df = lowest_rank(df)  # the rank every surface reads a several-rank run's charts from
    return df.sort_values("step") if "step" in df else df


def _figures(run: Run, cap: float | None, facts: Facts) -> list[Figure]:
    figs: list[Figure] = []
    steps = _one_rank(run.steps)
    if len(steps):
        phases = phase_columns(steps, run.meta)
        x = steps["step"].to_numpy(dtype=float)
        series = [Series(c.removesuffix("_s"), steps[c].fillna(0).to_numpy(dtype=float), i)
                  for i, c in enumerate(phases)]
        accounted = steps[phases].fillna(0).sum(axis=1) if phases else 0.0
        rest = (steps["duration_s"] - accounted).clip(lower=0).to_numpy(dtype=float)
        series.append(Series("outside phases", rest, "rest"))
        figs.append(Figure("Step time by phase", x, tuple(series), "step time", y_fmt="s", stacked=True))
        if "loss" in steps and steps["loss"].notna().any():
            figs.append(Figure("Loss", x, (Series("loss", steps["loss"].to_numpy(dtype=float), 0),), "loss",
                               legend=False))
    mem = _one_rank(run.memory)
    cats = [c for c in CATEGORIES if c in mem and mem[c].notna().any()]
    if len(mem) and cats:
        filled = mem[cats].ffill().fillna(0)
        series = [Series(c.removesuffix("_bytes"), filled[c].to_numpy(dtype=float), i) for i, c in enumerate(cats)]
        if "params_bytes" in cats and facts.frozen_params_bytes and "trainable_params_bytes" in mem:
            trainable = mem["trainable_params_bytes"].ffill().fillna(0).to_numpy(dtype=float)
            frozen = frozen_params(filled["params_bytes"].to_numpy(dtype=float), trainable)
            at = cats.index("params_bytes")  # the parameters as two bands: frozen, then trainable
            series[at:at + 1] = [Series("params (frozen)", frozen, "frozen"), Series("params (trainable)", trainable, 0)]
        hline = (cap, f"capacity {human_bytes(cap)}") if cap else None
        figs.append(Figure("Memory by category", mem["step"].to_numpy(dtype=float), tuple(series), "memory",
                           y_fmt="bytes", stacked=True, hline=hline))
    dev = _device_frame(run)
    cols = [c for c in DEVICE_ACTIVITY if c in dev and dev[c].notna().any()]
    if cols and len(steps):
        # device samples are timed, steps are numbered: place each sample at the step running then
        st = steps[["time", "step"]].sort_values("time")
        pos = np.searchsorted(st["time"].to_numpy(dtype=float), dev["time"].to_numpy(dtype=float))
        x = st["step"].to_numpy(dtype=float)[np.clip(pos, 0, len(st) - 1)]
        series = [Series(c.removesuffix("_pct"), dev[c].to_numpy(dtype=float), i) for i, c in enumerate(cols)]
        figs.append(Figure("GPU activity (%)", x, tuple(series), "busy (%)", y_zero=True))
    return figs


def _device_frame(run: Run) -> pd.DataFrame:
    try:
        dev = run.device
    except Exception:  # noqa: BLE001 - a damaged device table only loses its figure
        return pd.DataFrame()
    if dev is None or dev.empty or "time" not in dev:
        return pd.DataFrame()
    if "gpu" in dev and dev["gpu"].nunique() > 1:
        dev = dev[dev["gpu"] == dev["gpu"].min()]
    return dev.sort_values("time")
