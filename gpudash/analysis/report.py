"""A post-mortem as one self-contained HTML page (or Markdown for a terminal).

The page opens offline: CSS is inline and the figures are SVG drawn here from
the run's numbers (no JavaScript, no CDN, no external references). Every
string that came from the run (names, messages, evidence) is escaped.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.alerts import recorded_alerts
from gpudash.analysis.cost import DEFAULT_PRICE_PER_HOUR, on_gpu
from gpudash.analysis.facts import Facts, headline_rows, json_safe, run_facts
from gpudash.analysis.oom import CATEGORIES
from gpudash.analysis.phases import phase_columns
from gpudash.analysis.summary import summarize
from gpudash.analysis.svgchart import svg_chart
from gpudash.analysis.verdict import Verdict, fmt_bytes
from gpudash.store.run import Run

__all__ = ["headline", "render_html", "render_json", "render_markdown", "svg_chart"]

_SEV_COLOR = {"bad": "#c62828", "warn": "#ef6c00", "ok": "#2e7d32"}
_SEV_LABEL = {"bad": "problem", "warn": "warning", "ok": "ok"}
_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:960px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 10px}
.sub{color:#5b6475} table.kv{border-collapse:collapse;margin-top:12px}
table.kv td{padding:2px 14px 2px 0;vertical-align:top} table.kv td:first-child{color:#5b6475}
.verdict{background:#fff;border-left:5px solid #999;border-radius:6px;padding:10px 14px;margin:10px 0;
box-shadow:0 1px 2px rgba(0,0,0,.06)}
.verdict h3{font-size:15px;margin:0 0 4px}.badge{font-size:11px;text-transform:uppercase;color:#fff;
border-radius:3px;padding:1px 6px;margin-right:8px;vertical-align:2px}
.range{color:#5b6475;font-size:12px;margin-left:6px} .verdict ul{margin:6px 0 6px 18px;padding:0}
.rec{margin-top:6px}.rec b,.save b{color:#1d2330}.save{color:#2e5e1f}
figure{background:#fff;border-radius:6px;margin:12px 0;padding:10px;box-shadow:0 1px 2px rgba(0,0,0,.06)}
figcaption{font-weight:600;margin-bottom:4px} svg text{font:11px system-ui,sans-serif;fill:#5b6475}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
footer{color:#8a93a3;font-size:12px;margin-top:30px}
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _md_text(text: str) -> str:
    """Markdown with no raw HTML: a ``<`` that would open a tag and a ``&`` that would start an entity are
    escaped; a plain ``loss < 2`` stays readable in the terminal."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", re.sub(r"&(?=#?\w+;)", "&amp;", text))


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{c}"></i>{_e(k)}</span>'
                                           for k, c in items) + "</div>"


def _markers(run: Run, facts: Facts) -> list[tuple[float, str, str]]:
    """Event markers; loss spikes are the run's facts (the trainer's live events follow the same rule)."""
    ev = run.events
    out: list[tuple[float, str, str]] = [(float(s), "#ef6c00", f"step {s}: loss spike") for s in facts.loss_spike_steps]
    if ev.empty:
        return out[:200]
    colors = {"oom": "#c62828", "precision_fallback": "#6a1b9a", "nan": "#ad1457", "alert": "#b71c1c"}
    for _, e in ev.iterrows():
        kind = str(e["kind"])
        if kind in colors and not pd.isna(e["step"]):
            out.append((float(e["step"]), colors[kind], f"step {int(e['step'])}: {kind}: {e['message']}"))
    return sorted(out)[:200]


def _one_rank(df: pd.DataFrame) -> pd.DataFrame:
    if "rank" in df and df["rank"].nunique() > 1:
        df = df[df["rank"] == df["rank"].min()]
    return df.sort_values("step") if "step" in df else df


def _figures(run: Run, cap: float | None, facts: Facts) -> list[tuple[str, str]]:
    figs: list[tuple[str, str]] = []
    markers = _markers(run, facts)
    steps = _one_rank(run.steps)
    if len(steps):
        phases = phase_columns(steps, run.meta)
        x = steps["step"].to_numpy(dtype=float)
        series = [(c.removesuffix("_s"), steps[c].fillna(0).to_numpy(dtype=float), _PALETTE[i % len(_PALETTE)])
                  for i, c in enumerate(phases)]
        accounted = steps[phases].fillna(0).sum(axis=1) if phases else 0.0
        rest = (steps["duration_s"] - accounted).clip(lower=0).to_numpy(dtype=float)
        series.append(("outside phases", rest, "#bab0ac"))
        figs.append(("Step time by phase", _legend([(s[0], s[2]) for s in series])
                     + svg_chart(x, series, stacked=True, markers=markers, y_fmt="s", y_title="step time")))
        if "loss" in steps and steps["loss"].notna().any():
            figs.append(("Loss", svg_chart(x, [("loss", steps["loss"].to_numpy(dtype=float), _PALETTE[0])],
                                           markers=markers, y_title="loss")))
    mem = _one_rank(run.memory)
    cats = [c for c in CATEGORIES if c in mem and mem[c].notna().any()]
    if len(mem) and cats:
        filled = mem[cats].ffill().fillna(0)
        series = [(c.removesuffix("_bytes"), filled[c].to_numpy(dtype=float), _PALETTE[i % len(_PALETTE)])
                  for i, c in enumerate(cats)]
        if "params_bytes" in cats and facts.frozen_params_bytes and "trainable_params_bytes" in mem:
            trainable = mem["trainable_params_bytes"].ffill().fillna(0).to_numpy(dtype=float)
            frozen = np.clip(filled["params_bytes"].to_numpy(dtype=float) - trainable, 0, None)
            at = cats.index("params_bytes")  # the parameters as two bands: frozen, then trainable
            series[at:at + 1] = [("params (frozen)", frozen, "#aec7e8"), ("params (trainable)", trainable, _PALETTE[0])]
        hline = (cap, f"capacity {fmt_bytes(cap)}") if cap else None
        figs.append(("Memory by category", _legend([(s[0], s[2]) for s in series])
                     + svg_chart(mem["step"].to_numpy(dtype=float), series, stacked=True, markers=markers,
                                 hline=hline, y_fmt="bytes", y_title="memory")))
    dev = _device_frame(run)
    cols = [c for c in ("sm_active_pct", "gpu_util_pct", "sm_occupancy_pct", "tensor_active_pct") if c in dev
            and dev[c].notna().any()]
    if cols and len(steps):
        # device samples are timed, steps are numbered: place each sample at the step running then
        st = steps[["time", "step"]].sort_values("time")
        pos = np.searchsorted(st["time"].to_numpy(dtype=float), dev["time"].to_numpy(dtype=float))
        x = st["step"].to_numpy(dtype=float)[np.clip(pos, 0, len(st) - 1)]
        series = [(c.removesuffix("_pct"), dev[c].to_numpy(dtype=float), _PALETTE[i]) for i, c in enumerate(cols)]
        figs.append(("GPU activity (%)", _legend([(s[0], s[2]) for s in series])
                     + svg_chart(x, series, markers=markers, y_zero=True, y_title="busy (%)")))
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


def headline(run: Run, facts: Facts | None = None) -> list[tuple[str, str]]:
    """Key facts as (label, value) rows (:func:`gpudash.analysis.facts.headline_rows`)."""
    rows = headline_rows(facts if facts is not None else run_facts(run), run.meta)
    rows += [("damaged", p) for p in run.problems]
    return rows


def render_json(run: Run, verdicts: list[Verdict] | None = None, facts: Facts | None = None,
                price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> dict[str, Any]:
    """``{"facts": {...}, "verdicts": [...]}``: what ``gpudash report --format json`` prints (JSON-safe)."""
    if verdicts is None:
        verdicts = summarize(run, price_per_hour=price_per_hour)
    facts = facts if facts is not None else run_facts(run)
    return {"facts": facts.to_json(), "verdicts": json_safe([v.as_dict() for v in verdicts])}


def _capacity(run: Run, verdicts: list[Verdict]) -> float | None:
    for v in verdicts:
        if "capacity_bytes" in v.numbers:
            return v.numbers["capacity_bytes"]
    pre = run.meta.get("preflight")
    if isinstance(pre, dict) and isinstance(pre.get("capacity_bytes"), (int, float)):
        return float(pre["capacity_bytes"])
    return None


def _verdict_html(v: Verdict) -> str:
    color = _SEV_COLOR[v.severity]
    out = [f'<section class="verdict sev-{v.severity}" data-kind="{_e(v.kind)}" style="border-color:{color}">',
           f'<h3><span class="badge" style="background:{color}">{_SEV_LABEL[v.severity]}</span>{_e(v.title)}'
           + (f'<span class="range">{_e(v.step_range)}</span>' if v.steps else "") + "</h3>"]
    if v.evidence:
        out.append("<ul>" + "".join(f"<li>{_e(e)}</li>" for e in v.evidence) + "</ul>")
    if v.recommendation:
        out.append(f'<div class="rec"><b>Do:</b> {_e(v.recommendation)}</div>')
    if v.saving:
        out.append(f'<div class="save"><b>Saves:</b> {_e(v.saving)}</div>')
    out.append("</section>")
    return "".join(out)


def _actions(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.recommendation and v.severity != "ok"]


def _actions_html(verdicts: list[Verdict]) -> str:
    acts = _actions(verdicts)
    if not acts:
        return ""
    items = "".join(f"<li><b>{_e(v.title)}</b>: {_e(v.recommendation)}"
                    + (f' <span class="save">({_e(v.saving)})</span>' if v.saving else "") + "</li>" for v in acts)
    return f'<h2>What to change</h2><ol id="actions">{items}</ol>'


def _alerts_html(run: Run) -> str:
    alerts = recorded_alerts(run)
    if not alerts:
        return ""
    items = "".join(f"<li>{'' if a.step is None else f'step {a.step}: '}<b>{_e(a.kind)}</b>: {_e(a.text)}</li>"
                    for a in alerts[:200])
    return f'<h2>Alerts raised during the run</h2><ul id="alerts">{items}</ul>'


def render_html(run: Run, verdicts: list[Verdict] | None = None,
                price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> str:
    """The whole report as one HTML string with no external references."""
    if verdicts is None:
        verdicts = summarize(run, price_per_hour=price_per_hour)
    title = f"gpudash report: {run.name}"
    facts = run_facts(run)
    kv = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in headline(run, facts))
    figs = "".join(f"<figure><figcaption>{_e(t)}</figcaption>{body}</figure>"
                   for t, body in _figures(run, _capacity(run, verdicts), facts))
    worst = next((v for v in verdicts if v.severity != "ok"), None)
    lead = f"{_e(worst.title)}" if worst else "Nothing wrong found."
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>"
            f"<h1>{_e(title)}</h1><div class=\"sub\">{_e(run.path)}</div>"
            f'<p id="lead"><b>{lead}</b></p><table class="kv">{kv}</table>'
            f"{_actions_html(verdicts)}{_alerts_html(run)}"
            f'<h2>Verdicts</h2><div id="verdicts">{"".join(_verdict_html(v) for v in verdicts)}</div>'
            f"<h2>Figures</h2>{figs or '<p>No steps recorded.</p>'}"
            f"<footer>gpudash report, {_e(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))}"
            + (f"; price {price_per_hour:.2f} $/GPU-hour" if on_gpu(run) else "; a CPU run: no GPU price")
            + "</footer></main></body></html>")


def render_markdown(run: Run, verdicts: list[Verdict] | None = None,
                    price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> str:
    """A readable terminal summary (Markdown)."""
    if verdicts is None:
        verdicts = summarize(run, price_per_hour=price_per_hour)
    lines = [f"# gpudash report: {run.name}", "", f"`{run.path}`", ""]
    lines += [f"- **{k}**: {v}" for k, v in headline(run)]
    acts = _actions(verdicts)
    if acts:
        lines += ["", "## What to change", ""]
        lines += [f"{i}. **{v.title}**: {v.recommendation}" + (f" ({v.saving})" if v.saving else "")
                  for i, v in enumerate(acts, 1)]
    alerts = recorded_alerts(run)
    if alerts:
        lines += ["", "## Alerts raised during the run", ""]
        lines += [f"- {'' if a.step is None else f'step {a.step}: '}**{a.kind}**: {a.text}" for a in alerts[:200]]
    lines += ["", "## Verdicts", ""]
    mark = {"bad": "[PROBLEM]", "warn": "[WARNING]", "ok": "[ok]"}
    for v in verdicts:
        rng = f" ({v.step_range})" if v.steps else ""
        lines.append(f"### {mark[v.severity]} {v.title}{rng}")
        lines += [f"- {e}" for e in v.evidence]
        if v.recommendation:
            lines.append(f"- **Do:** {v.recommendation}")
        if v.saving:
            lines.append(f"- **Saves:** {v.saving}")
        lines.append("")
    return _md_text("\n".join(lines))
