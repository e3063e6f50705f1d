"""Straggler lights of a several-rank run: step-time skew and the slowest rank, the phase that explains it
(under DDP the fast ranks wait inside backward), memory imbalance, and with ranks on several nodes the node
that is slow as a whole. Derived here once; the Ranks section only draws them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd

from gpudash.analysis.phases import phase_columns
from gpudash.analysis.ranks import STRAGGLER_RATIO, WAIT_PHASE, node_stragglers, rank_skew, straggler_summary
from gpudash.analysis.verdict import fmt_s
from gpudash.units import fmt_num

__all__ = ["GREEN", "RED", "RankLight", "late_text", "several_nodes", "straggler_lights"]

RankLight = tuple[str, str, str]  # (signal, "green" | "amber" | "red" | "grey", one-line detail)
#: Skew (slowest / median - 1, or a phase's spread over the median step) below GREEN is noise, above RED acts.
GREEN, RED = 0.05, 0.20


def several_nodes(nodes: dict[int, str] | None) -> bool:
    """Whether the ranks sit on more than one node."""
    return bool(nodes) and len(set(nodes.values())) > 1  # type: ignore[union-attr]


def _color(value: float | None) -> str:
    if value is None:
        return "grey"
    return "green" if value < GREEN else "amber" if value < RED else "red"


def _phase_spreads(skew: pd.DataFrame, phases: list[str]) -> dict[str, tuple[float, int | None, float]]:
    """Per phase: median spread across ranks (s), the rank most often slowest in it and how often."""
    out: dict[str, tuple[float, int | None, float]] = {}
    for ph in phases:
        col = f"{ph}_skew_s"
        if col not in skew or not skew[col].notna().any():
            continue
        slow = skew[f"{ph}_slowest_rank"].dropna() if f"{ph}_slowest_rank" in skew else pd.Series(dtype=float)
        counts = slow.value_counts()
        out[ph] = (float(skew[col].median()), int(counts.index[0]) if len(counts) else None,
                   float(counts.iloc[0] / len(skew)) if len(counts) else 0.0)
    return out


def _cause_phase(spreads: dict[str, tuple[float, int | None, float]]) -> str | None:
    """The phase that explains the skew. Under DDP the fast ranks wait for the straggler inside ``backward``
    (the gradient all-reduce), so backward's spread is the symptom: another phase with at least half of its
    spread is the cause."""
    if not spreads:
        return None
    others = {ph: v for ph, v in spreads.items() if ph != WAIT_PHASE}
    best = max(others, key=lambda ph: others[ph][0]) if others else None
    wait = spreads.get(WAIT_PHASE)
    if best is None or (wait is not None and wait[0] > 2 * others[best][0]):
        return WAIT_PHASE if wait is not None else best
    return best


def straggler_lights(steps: pd.DataFrame, memory: pd.DataFrame, nodes: dict[int, str] | None = None) -> list[RankLight]:
    """Traffic lights: step-time skew (and the slowest rank), the phase that differs most across ranks (under
    DDP the fast ranks wait inside backward, so the cause shows here), and memory imbalance; with ranks on
    several ``nodes``, a node light (a node whose ranks are all slow is one node straggler)."""
    skew = rank_skew(SimpleNamespace(steps=steps, memory=memory))
    if skew.empty:
        return [("straggler", "grey", "no step recorded by two ranks yet")]
    s = straggler_summary(skew)
    lights: list[RankLight] = []
    ratio = s.get("skew_ratio_median")
    p95 = s.get("skew_ratio_p95")
    detail = (f"slowest rank {s['slowest_rank']} ({100 * s['slowest_rank_share']:.0f} % of steps); "
              f"slowest step over the median step: {fmt_num(None if ratio is None else 100 * ratio, 2)} % "
              f"(median), {fmt_num(None if p95 is None else 100 * p95, 2)} % (p95); "
              f"{100 * s['slow_steps_share']:.0f} % of {s['steps']} steps over 10 %")
    lights.append(("step-time skew", _color(ratio), detail))
    spreads = _phase_spreads(skew, [c.removesuffix("_s") for c in phase_columns(steps)])
    cause = _cause_phase(spreads)
    median_step = float(skew["duration_median_s"].median())
    if cause is None:
        lights.append(("slowest phase", "grey", "no phases recorded (monitor.phase(...))"))
    else:
        spread, rank, share = spreads[cause]
        rel = spread / median_step if median_step > 0 else None
        who = "" if rank is None else f"rank {rank} slowest in {100 * share:.0f} % of steps; "
        detail = f"{cause}: {who}spread {fmt_s(spread)} ({fmt_num(None if rel is None else 100 * rel, 2)} % of a step)"
        wait = spreads.get(WAIT_PHASE)
        if cause != WAIT_PHASE and wait is not None and wait[1] is not None and wait[1] != rank:
            detail += f"; rank {wait[1]} waits for it in {WAIT_PHASE}"
        lights.append(("slowest phase", _color(rel), detail))
    imb = s.get("memory_imbalance_max")
    if imb is None:
        lights.append(("memory imbalance", "grey", "memory not recorded"))
    elif float(imb) < 0.005:
        lights.append(("memory imbalance", "green", "ranks within 0.5 % of the mean"))
    else:
        lights.append(("memory imbalance", _color(float(imb)),
                       f"heaviest rank {s['heaviest_rank']}: {100 * float(imb):.1f} % over the mean at step "
                       f"{s['memory_imbalance_step']}"))
    verdict = _verdict(lights, s, cause, spreads)
    if several_nodes(nodes):
        node_light = _node_light(node_stragglers(SimpleNamespace(steps=steps, memory=memory), nodes))
        lights.append(node_light)
        if node_light[2].startswith("node ") and node_light[1] in ("amber", "red"):
            order = ("grey", "green", "amber", "red")
            color = max(verdict[1], node_light[1], key=order.index)
            verdict = ("straggler", color, node_light[2].split(";")[0])
    return [verdict, *lights]


def late_text(excess: float) -> str:
    return f"{100 * excess:.0f} % of a step late"


def _node_light(st: dict[str, Any]) -> RankLight:
    """The node light: the slow node(s) named once, else the slow ranks on healthy nodes, else green."""
    if not st["steps"]:
        return ("node straggler", "grey", "no step recorded by two ranks yet")
    by_node: pd.DataFrame = st["nodes"]
    if st["node_stragglers"]:
        worst = st["node_stragglers"][0]
        excess = float(by_node.loc[worst, "excess_median"])
        more = f"; {len(st['node_stragglers']) - 1} more slow node(s)" if len(st["node_stragglers"]) > 1 else ""
        return ("node straggler", _color(excess),
                f"node {worst} (all {int(by_node.loc[worst, 'ranks'])} ranks, {late_text(excess)}){more}")
    if st["rank_stragglers"]:
        return ("node straggler", "green",
                f"no node is slow as a whole; {len(st['rank_stragglers'])} slow rank(s) on healthy nodes")
    return ("node straggler", "green", f"{len(by_node)} nodes within {100 * STRAGGLER_RATIO:.0f} % of a step")





def _verdict(lights: list[RankLight], s: dict[str, Any], cause: str | None,
             spreads: dict[str, tuple[float, int | None, float]]) -> RankLight:
    """The headline light: which rank straggles and where, from the step-time and phase lights."""
    order = ("grey", "green", "amber", "red")
    step_color, phase_color = lights[0][1], lights[1][1]
    color = max(step_color, phase_color, key=order.index)
    if color in ("green", "grey"):
        return ("straggler", color, "none: ranks within 5 % of each other" if color == "green" else "not known")
    if phase_color == color and cause is not None and spreads[cause][1] is not None:
        return ("straggler", color, f"rank {spreads[cause][1]} (slow in {cause})")
    return ("straggler", color, f"rank {s['slowest_rank']} (slowest step in {100 * s['slowest_rank_share']:.0f} % "
                                "of steps)")
