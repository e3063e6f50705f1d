"""Stragglers and imbalance across ranks (torchrun): pure functions of a run.

Under DDP every rank waits for the slowest one in the gradient all-reduce, so
a straggler shows up twice: as a spread of step times across ranks, and as
phases that take longer on the slow rank (data, forward) while the fast ranks
spend the difference waiting inside ``backward``. :func:`rank_skew` lines the
ranks up step by step; :func:`straggler_summary` names the usual suspect;
:func:`rank_summary` is the side-by-side table, one row per rank.

Each function takes a :class:`gpudash.Run` or anything with ``steps`` and
``memory`` DataFrames (e.g. frames a live view has read with ``RunReader``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.phases import phase_columns
from gpudash.analysis.rates import rate_of
from gpudash.store.schema import MEMORY_PARTS

__all__ = ["MEMORY_COLUMNS", "STRAGGLER_RATIO", "WAIT_PHASE", "node_stragglers", "rank_nodes", "rank_skew",
           "lowest_rank", "rank_summary", "rank_work", "run_stragglers", "straggler_summary"]

#: Memory columns compared across ranks, best first: the allocator's view on
#: GPU, else the sum of the categories the Monitor measures on any device.
MEMORY_COLUMNS = ("allocated_bytes", "reserved_bytes")


def lowest_rank(df: pd.DataFrame, rank: int | None = None) -> pd.DataFrame:
    """The rows of one rank of a several-rank frame: ``rank``, else the lowest recorded (the rank a run's loss,
    memory, bottlenecks and progress are read from, and compare draws). A frame of one rank comes back whole."""
    if "rank" not in df or not len(df):
        return df
    r = pd.to_numeric(df["rank"], errors="coerce")
    if r.nunique() < 2:
        return df
    return df[r == (r.min() if rank is None else rank)]


def _memory_series(memory: pd.DataFrame) -> tuple[pd.Series, str] | None:
    for col in MEMORY_COLUMNS:
        if col in memory and memory[col].notna().any():
            return memory[col].astype(float), col
    cats = [c for c in MEMORY_PARTS if c in memory]
    if cats:
        # activations are measured on sampled steps only, and ranks sample different
        # steps: carry each rank's last measurement forward so steps compare like with like
        filled = memory.sort_values("step")[["rank", *cats]].astype(float).groupby("rank").ffill()
        return filled.reindex(memory.index).sum(axis=1, min_count=1), "categories_bytes"
    return None


def rank_skew(run: Any) -> pd.DataFrame:
    """Per-step spread across ranks of step time, phase times and memory.

    ``run`` is a :class:`gpudash.Run` (anything with ``steps`` and ``memory``
    DataFrames carrying ``rank`` and ``step`` columns). Returns one row per step
    that at least two ranks recorded, indexed by ``step``, with columns

    - ``ranks``: how many ranks recorded the step;
    - ``duration_min_s``, ``duration_median_s``, ``duration_max_s``,
      ``slowest_rank``, ``skew_s`` (max - min) and ``skew_ratio``
      (max / median - 1: 0.25 means the slowest rank took 25 % longer);
    - ``<phase>_skew_s`` and ``<phase>_slowest_rank`` for each phase column;
    - ``memory_min_bytes``, ``memory_max_bytes``, ``heaviest_rank`` and
      ``memory_imbalance`` (max / mean - 1) when memory was recorded; the
      ``memory_source`` attribute of the frame names the column compared.

    An empty frame (same columns) means fewer than two ranks.
    """
    steps: pd.DataFrame = getattr(run, "steps", pd.DataFrame())
    memory: pd.DataFrame = getattr(run, "memory", pd.DataFrame())
    base = ["ranks", "duration_min_s", "duration_median_s", "duration_max_s", "slowest_rank", "skew_s",
            "skew_ratio"]
    if steps.empty or "rank" not in steps or "duration_s" not in steps or steps["rank"].nunique() < 2:
        out = pd.DataFrame(columns=base)
        out.index.name = "step"
        return out
    s = steps.dropna(subset=["step", "duration_s"]).drop_duplicates(["rank", "step"], keep="last")
    dur = s.pivot(index="step", columns="rank", values="duration_s").astype(float)
    dur = dur[dur.notna().sum(axis=1) >= 2]
    out = pd.DataFrame(index=dur.index)
    out["ranks"] = dur.notna().sum(axis=1).astype("int64")
    out["duration_min_s"] = dur.min(axis=1)
    out["duration_median_s"] = dur.median(axis=1)
    out["duration_max_s"] = dur.max(axis=1)
    out["slowest_rank"] = dur.idxmax(axis=1).astype("int64")
    out["skew_s"] = out["duration_max_s"] - out["duration_min_s"]
    median = out["duration_median_s"].where(out["duration_median_s"] > 0)
    out["skew_ratio"] = out["duration_max_s"] / median - 1.0
    phases = [c for c in phase_columns(s, getattr(run, "meta", None)) if pd.api.types.is_numeric_dtype(s[c])]
    for ph in phases:
        p = s.pivot(index="step", columns="rank", values=ph).astype(float).reindex(out.index)
        name = ph.removesuffix("_s")
        out[f"{name}_skew_s"] = p.max(axis=1) - p.min(axis=1)
        filled = p.fillna(-np.inf)
        out[f"{name}_slowest_rank"] = filled.idxmax(axis=1).where(p.notna().any(axis=1))
    mem = _memory_series(memory) if not memory.empty and {"rank", "step"} <= set(memory.columns) else None
    if mem is not None:
        values, source = mem
        m = memory.assign(_mem=values).dropna(subset=["step", "_mem"])
        m = m.drop_duplicates(["rank", "step"], keep="last")
        piv = m.pivot(index="step", columns="rank", values="_mem").reindex(out.index)
        out["memory_min_bytes"] = piv.min(axis=1)
        out["memory_max_bytes"] = piv.max(axis=1)
        out["heaviest_rank"] = piv.fillna(-np.inf).idxmax(axis=1).where(piv.notna().any(axis=1))
        mean = piv.mean(axis=1)
        out["memory_imbalance"] = out["memory_max_bytes"] / mean.where(mean > 0) - 1.0
        out.attrs["memory_source"] = source
    out.index = out.index.astype("int64")
    out.index.name = "step"
    return out


def straggler_summary(skew: pd.DataFrame, threshold: float = 0.1) -> dict[str, Any]:
    """Headline numbers from :func:`rank_skew`: median and p95 skew ratio, the
    rank that is slowest most often and the share of steps where the skew
    exceeds ``threshold`` (0.1 = 10 %), and the worst memory imbalance."""
    if skew.empty:
        return {"steps": 0}
    ratio = skew["skew_ratio"].dropna()
    out: dict[str, Any] = {
        "steps": int(len(skew)),
        "skew_ratio_median": float(ratio.median()) if len(ratio) else None,
        "skew_ratio_p95": float(ratio.quantile(0.95)) if len(ratio) else None,
        "skew_s_median": float(skew["skew_s"].median()),
        "slow_steps_share": float((ratio > threshold).mean()) if len(ratio) else 0.0,
    }
    counts = skew["slowest_rank"].value_counts()
    out["slowest_rank"] = int(counts.index[0])
    out["slowest_rank_share"] = float(counts.iloc[0] / len(skew))
    if "memory_imbalance" in skew and skew["memory_imbalance"].notna().any():
        pos = int(np.nanargmax(skew["memory_imbalance"].to_numpy(dtype=float)))
        out["memory_imbalance_max"] = float(skew["memory_imbalance"].iloc[pos])
        out["memory_imbalance_step"] = int(skew.index[pos])
        out["heaviest_rank"] = int(skew["heaviest_rank"].iloc[pos])
    return out


def rank_summary(run: Any, skew_from: Any = None) -> pd.DataFrame:
    """One row per rank: steps recorded, median and p95 step time, median of each
    phase, peak memory, samples/s and tokens/s (``samples_per_s``, ``tokens_per_s``: wall time, as
    :func:`gpudash.analysis.rates.rate_of`) and how often this rank was the slowest (``slowest_share``).
    Every row counts: pass the full steps, not a downsampled frame. ``skew_from``: the frames the slowest-rank
    share is read from instead (a step-by-step comparison of the ranks: a downsampled view keeps it cheap on a
    long run; the other columns are sums, medians and peaks, cheap over every row)."""
    steps: pd.DataFrame = getattr(run, "steps", pd.DataFrame())
    memory: pd.DataFrame = getattr(run, "memory", pd.DataFrame())
    if steps.empty or "rank" not in steps or "duration_s" not in steps:
        out = pd.DataFrame(columns=["steps", "step_median_s", "step_p95_s"])
        out.index.name = "rank"
        return out
    g = steps.groupby("rank")
    out = pd.DataFrame({"steps": g["step"].count() if "step" in steps else g.size(),
                        "step_median_s": g["duration_s"].median(),
                        "step_p95_s": g["duration_s"].quantile(0.95)})
    for ph in (c for c in phase_columns(steps, getattr(run, "meta", None))
               if pd.api.types.is_numeric_dtype(steps[c])):
        out[f"{ph.removesuffix('_s')}_median_s"] = g[ph].median()
    mem = _memory_series(memory) if not memory.empty and "rank" in memory else None
    if mem is not None:
        values, source = mem
        out["memory_peak_bytes"] = values.groupby(memory["rank"]).max()
        out.attrs["memory_source"] = source
    skew = rank_skew(run if skew_from is None else skew_from)
    if not skew.empty:
        share = skew["slowest_rank"].value_counts() / len(skew)
        out["slowest_share"] = share.reindex(out.index).fillna(0.0)
    for col in ("samples", "tokens"):  # each rank's own wall-time rate, as the job's (analysis.rates)
        if col in steps:
            rates = {rank: rate_of(g_rows, col) for rank, g_rows in g}
            if any(v is not None for v in rates.values()):
                out[f"{col}_per_s"] = pd.Series(rates, dtype="float64")
    out.index = out.index.astype("int64")
    out.index.name = "rank"
    return out


# ---- nodes: ranks grouped by the machine they ran on ---------------------------------------
#: Where data-parallel ranks wait for each other (DDP all-reduces gradients during backward): time a fast
#: rank spends there is the slow rank's fault, so a rank's own work is its step minus this phase.
WAIT_PHASE = "backward"
#: A rank whose own work takes this much longer than the median rank's (median over steps) straggles.
STRAGGLER_RATIO = 0.1


def rank_nodes(rank_meta: dict[int, dict[str, Any]]) -> dict[int, str]:
    """The node (machine) each rank ran on, from its meta: ``node`` (host name or ``$GPUDASH_HOSTNAME``),
    else ``hostname``, else ``host``; ``"?"`` when none was recorded."""
    out: dict[int, str] = {}
    for rank, meta in rank_meta.items():
        name = next((meta[k] for k in ("node", "hostname", "host") if isinstance(meta.get(k), str) and meta[k]),
                    "?")
        out[int(rank)] = str(name)
    return out


def rank_work(run: Any) -> pd.DataFrame:
    """Step × rank seconds of each rank's own work: the step time minus the time in :data:`WAIT_PHASE` when
    that phase was recorded (under DDP the fast ranks wait there for the slow one, so their step times are
    all alike), else the step time. ``attrs["measure"]`` names what was measured."""
    steps: pd.DataFrame = getattr(run, "steps", pd.DataFrame())
    if steps.empty or not {"rank", "step", "duration_s"} <= set(steps.columns):
        return pd.DataFrame()
    cols = ["rank", "step", "duration_s"] + ([f"{WAIT_PHASE}_s"] if f"{WAIT_PHASE}_s" in steps else [])
    s = steps[cols].apply(pd.to_numeric, errors="coerce").dropna(subset=["rank", "step", "duration_s"])
    s = s.drop_duplicates(["rank", "step"], keep="last")
    measure = "step time"
    work = s["duration_s"]
    if len(cols) == 4 and s[cols[3]].notna().any():
        work = (s["duration_s"] - s[cols[3]].fillna(0.0)).clip(lower=0.0)
        measure = f"step time outside {WAIT_PHASE}"
    out = s.assign(work=work).pivot(index="step", columns="rank", values="work").astype(float)
    out.index = out.index.astype("int64")
    out.columns = out.columns.astype("int64")
    out.attrs["measure"] = measure
    return out


def node_stragglers(run: Any, nodes: dict[int, str] | None = None,
                    threshold: float = STRAGGLER_RATIO) -> dict[str, Any]:
    """Stragglers by node. Each rank's ``excess``: the median over steps of how much longer its own work
    (:func:`rank_work`) took than the step's lower-quartile rank's, as a share of the step's median step
    time (0.25: a quarter of a step late). A node whose ranks all exceed
    ``threshold`` while another node has a rank that does not is a *node* straggler (a slow machine,
    network link or shared data source), named once instead of as one straggler per rank; the ranks that
    straggle on an otherwise healthy node are rank stragglers.

    ``nodes`` maps rank -> node name (:func:`rank_nodes`); default: ``run.rank_meta``. Returns
    ``measure``, ``steps``, ``ranks`` (a frame indexed by rank: ``node``, ``excess``, ``straggler``),
    ``nodes`` (a frame indexed by node: ``ranks``, ``slow_ranks``, ``excess_median``, ``straggler``),
    ``node_stragglers`` and ``rank_stragglers`` (lists, worst first)."""
    if nodes is None:
        nodes = rank_nodes(getattr(run, "rank_meta", {}) or {})
    work = rank_work(run)
    if not work.empty:
        work = work[work.notna().sum(axis=1) >= 2]
    empty: dict[str, Any] = {"measure": work.attrs.get("measure", "step time"), "steps": 0,
                             "ranks": pd.DataFrame(columns=["node", "excess", "straggler"]),
                             "nodes": pd.DataFrame(columns=["ranks", "slow_ranks", "excess_median", "straggler"]),
                             "node_stragglers": [], "rank_stragglers": []}
    if work.empty or work.shape[1] < 2:
        return empty
    # the reference is a fast rank (the lower quartile), not the median one: when a whole node of the
    # run's ranks is slow, half of them can be slow and the median rank is one of them
    reference = work.quantile(0.25, axis=1)
    steps: pd.DataFrame = run.steps
    dur = (steps[["rank", "step", "duration_s"]].apply(pd.to_numeric, errors="coerce")
           .dropna().groupby("step")["duration_s"].median())
    dur.index = dur.index.astype("int64")
    scale = dur.reindex(work.index)
    excess = work.sub(reference, axis=0).div(scale.where(scale > 0), axis=0).median(axis=0)
    ranks = pd.DataFrame({"node": [nodes.get(int(r), "?") for r in excess.index], "excess": excess.astype(float)},
                         index=excess.index.astype("int64"))
    ranks.index.name = "rank"
    slow = ranks["excess"] > threshold
    g = ranks.assign(slow=slow).groupby("node", sort=True)
    by_node = pd.DataFrame({"ranks": g.size(), "slow_ranks": g["slow"].sum().astype("int64"),
                            "excess_median": g["excess"].median()})
    healthy_elsewhere = by_node["slow_ranks"] < by_node["ranks"]
    by_node["straggler"] = [bool(row.slow_ranks == row.ranks and row.ranks >= 1 and len(by_node) > 1
                                 and healthy_elsewhere.drop(node).any())
                            for node, row in by_node.iterrows()]
    slow_nodes = set(by_node.index[by_node["straggler"]])
    ranks["straggler"] = [("node" if node in slow_nodes else "rank") if s else None
                          for node, s in zip(ranks["node"], slow, strict=True)]
    node_list = by_node[by_node["straggler"]].sort_values("excess_median", ascending=False).index.tolist()
    rank_list = ranks[ranks["straggler"] == "rank"].sort_values("excess", ascending=False).index.tolist()
    return {"measure": work.attrs.get("measure", "step time"), "steps": int(len(work)), "ranks": ranks,
            "nodes": by_node, "node_stragglers": [str(n) for n in node_list],
            "rank_stragglers": [int(r) for r in rank_list]}



def run_stragglers(run: Any) -> dict[str, Any]:
    """The run's stragglers as every surface names them (the facts, the verdicts, the alerts):
    :func:`node_stragglers` over the nodes its ranks recorded (``run.rank_meta``). One rank: none."""
    return node_stragglers(run, rank_nodes(getattr(run, "rank_meta", {}) or {}))
