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


class _Grid:
    """Rows of a frame with ``rank`` and ``step`` columns as step x rank matrices (numpy, NaN where a rank did
    not record a step; the last row wins where one recorded a step twice): the step-by-step comparisons of the
    ranks read every row this way, as pandas pivots took seconds on a long many-rank run."""

    __slots__ = ("steps", "ranks", "_rows", "_cells", "_shape")

    def __init__(self, df: pd.DataFrame, required: tuple[str, ...] = ()) -> None:
        step = pd.to_numeric(df["step"], errors="coerce").to_numpy(dtype=float)
        rank = pd.to_numeric(df["rank"], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(step) & np.isfinite(rank)
        for col in required:
            ok &= np.isfinite(pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float))
        rows = np.flatnonzero(ok)
        self.steps, si = np.unique(step[rows].astype(np.int64), return_inverse=True)
        self.ranks, ri = np.unique(rank[rows].astype(np.int64), return_inverse=True)
        cells = si * len(self.ranks) + ri
        # the last row of each (step, rank): unique's first index into the reversed cells
        _, last = np.unique(cells[::-1], return_index=True)
        keep = len(cells) - 1 - last
        self._rows, self._cells = rows[keep], cells[keep]
        self._shape = (len(self.steps), len(self.ranks))

    def matrix(self, values: Any) -> np.ndarray:
        """``values`` (a column of the frame, aligned with its rows) as a step x rank float matrix."""
        v = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
        out = np.full(self._shape[0] * self._shape[1], np.nan)
        out[self._cells] = v[self._rows]
        return out.reshape(self._shape)


def _row_quantile(mat: np.ndarray, q: float) -> np.ndarray:
    """Per row, the ``q`` quantile of its values, NaN skipped (linear, as numpy's default; NaN for a row with
    none): ``np.nanquantile`` along an axis loops in Python, a second over 2,000 x 64."""
    srt = np.sort(mat, axis=1)  # NaN last
    n = (~np.isnan(mat)).sum(axis=1)
    pos = q * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    a = np.take_along_axis(srt, lo[:, None], axis=1)[:, 0]
    b = np.take_along_axis(srt, hi[:, None], axis=1)[:, 0]
    return np.where(n > 0, a + (b - a) * (pos - lo), np.nan)


def _slowest(mat: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Per row, the rank of the largest value (NaN where the row has none)."""
    has = ~np.isnan(mat).all(axis=1)
    out = np.full(len(mat), np.nan)
    if has.any():
        out[has] = ranks[np.argmax(np.where(np.isnan(mat[has]), -np.inf, mat[has]), axis=1)]
    return out


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

    An empty frame (same columns) means fewer than two ranks. Every row is read (numpy step x rank
    matrices: 64 ranks x 2,000 steps in tens of milliseconds).
    """
    steps: pd.DataFrame = getattr(run, "steps", pd.DataFrame())
    memory: pd.DataFrame = getattr(run, "memory", pd.DataFrame())
    base = ["ranks", "duration_min_s", "duration_median_s", "duration_max_s", "slowest_rank", "skew_s",
            "skew_ratio"]
    if (steps.empty or not {"rank", "step", "duration_s"} <= set(steps.columns)
            or steps["rank"].nunique() < 2):
        out = pd.DataFrame(columns=base)
        out.index.name = "step"
        return out
    grid = _Grid(steps, ("duration_s",))
    dur = grid.matrix(steps["duration_s"])
    counts = (~np.isnan(dur)).sum(axis=1)
    two = counts >= 2
    dur = dur[two]
    index = pd.Index(grid.steps[two], name="step")
    with np.errstate(invalid="ignore", divide="ignore"):
        lo, hi = np.fmin.reduce(dur, axis=1), np.fmax.reduce(dur, axis=1)
        median = _row_quantile(dur, 0.5)
        cols: dict[str, Any] = {
            "ranks": counts[two].astype("int64"), "duration_min_s": lo, "duration_median_s": median,
            "duration_max_s": hi, "slowest_rank": _slowest(dur, grid.ranks).astype("int64"), "skew_s": hi - lo,
            "skew_ratio": hi / np.where(median > 0, median, np.nan) - 1.0}
        phases = [c for c in phase_columns(steps, getattr(run, "meta", None))
                  if pd.api.types.is_numeric_dtype(steps[c])]
        for ph in phases:
            p = grid.matrix(steps[ph])[two]
            name = ph.removesuffix("_s")
            cols[f"{name}_skew_s"] = np.fmax.reduce(p, axis=1) - np.fmin.reduce(p, axis=1)
            cols[f"{name}_slowest_rank"] = _slowest(p, grid.ranks)
    out = pd.DataFrame(cols, index=index)
    mem = _memory_series(memory) if not memory.empty and {"rank", "step"} <= set(memory.columns) else None
    if mem is not None:
        values, source = mem
        m = memory.assign(_mem=values)
        mgrid = _Grid(m, ("_mem",))
        full = mgrid.matrix(m["_mem"])
        # the memory grid's steps lined up with the step-time rows (NaN where memory has no such step)
        piv = np.full((len(index), full.shape[1]), np.nan)
        at = np.minimum(np.searchsorted(mgrid.steps, index.to_numpy()), max(len(mgrid.steps) - 1, 0))
        found = mgrid.steps[at] == index.to_numpy() if len(mgrid.steps) else np.zeros(len(index), bool)
        piv[found] = full[at[found]]
        with np.errstate(invalid="ignore", divide="ignore"):
            out["memory_min_bytes"] = np.fmin.reduce(piv, axis=1) if piv.shape[1] else np.nan
            out["memory_max_bytes"] = np.fmax.reduce(piv, axis=1) if piv.shape[1] else np.nan
            out["heaviest_rank"] = _slowest(piv, mgrid.ranks) if piv.shape[1] else np.nan
            n = (~np.isnan(piv)).sum(axis=1)
            mean = np.where(n > 0, np.nansum(piv, axis=1) / np.maximum(n, 1), np.nan)
            out["memory_imbalance"] = out["memory_max_bytes"] / np.where(mean > 0, mean, np.nan) - 1.0
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


def rank_summary(run: Any) -> pd.DataFrame:
    """One row per rank: steps recorded, median and p95 step time, median of each
    phase, peak memory, samples/s and tokens/s (``samples_per_s``, ``tokens_per_s``: wall time, as
    :func:`gpudash.analysis.rates.rate_of`) and how often this rank was the slowest (``slowest_share``).
    Every row counts: pass the full steps, not a downsampled frame."""
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
    skew = rank_skew(run)
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
    grid = _Grid(steps, ("duration_s",))
    work = grid.matrix(steps["duration_s"])
    measure = "step time"
    wait = f"{WAIT_PHASE}_s"
    if wait in steps:
        waited = grid.matrix(steps[wait])
        if not np.isnan(waited).all():
            work = np.clip(work - np.nan_to_num(waited), 0.0, None)
            measure = f"step time outside {WAIT_PHASE}"
    out = pd.DataFrame(work, index=pd.Index(grid.steps, name="step"), columns=pd.Index(grid.ranks, name="rank"))
    out.attrs["measure"] = measure
    return out


def _excess(grid_values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Per rank: the median over steps of how much longer it took than the step's lower-quartile rank, as a
    share of ``scale`` (the step's median step time)."""
    # the reference is a fast rank (the lower quartile), not the median one: when a whole node of the
    # run's ranks is slow, half of them can be slow and the median rank is one of them
    reference = _row_quantile(grid_values, 0.25)
    with np.errstate(invalid="ignore", divide="ignore"):
        late = (grid_values - reference[:, None]) / np.where(scale > 0, scale, np.nan)[:, None]
    return _row_quantile(late.T, 0.5)


def node_stragglers(run: Any, nodes: dict[int, str] | None = None,
                    threshold: float = STRAGGLER_RATIO) -> dict[str, Any]:
    """Stragglers by node. Each rank's ``excess``: the median over steps of how much longer it took than the
    step's lower-quartile rank, as a share of the step's median step time (0.25: a quarter of a step late),
    the larger of two measures: its own work (:func:`rank_work`: under DDP the fast ranks wait for the slow
    one in backward, so all step times are alike and only the time outside backward tells) and its step
    time (ranks that do not wait for each other: a rank slow in backward itself takes longer steps). A node
    whose ranks all exceed ``threshold`` while another node has a rank that does not is a *node* straggler
    (a slow machine, network link or shared data source), named once instead of as one straggler per rank;
    the ranks that straggle on an otherwise healthy node are rank stragglers. Every row is read.

    ``nodes`` maps rank -> node name (:func:`rank_nodes`); default: ``run.rank_meta``. Returns
    ``measure``, ``steps``, ``ranks`` (a frame indexed by rank: ``node``, ``excess``, ``straggler``),
    ``nodes`` (a frame indexed by node: ``ranks``, ``slow_ranks``, ``excess_median``, ``straggler``),
    ``node_stragglers`` and ``rank_stragglers`` (lists, worst first)."""
    if nodes is None:
        nodes = rank_nodes(getattr(run, "rank_meta", {}) or {})
    work = rank_work(run)
    measure = str(work.attrs.get("measure", "step time"))
    empty: dict[str, Any] = {"measure": measure, "steps": 0,
                             "ranks": pd.DataFrame(columns=["node", "excess", "straggler"]),
                             "nodes": pd.DataFrame(columns=["ranks", "slow_ranks", "excess_median", "straggler"]),
                             "node_stragglers": [], "rank_stragglers": []}
    if work.empty or work.shape[1] < 2:
        return empty
    w = work.to_numpy()
    two = (~np.isnan(w)).sum(axis=1) >= 2
    if not two.any():
        return empty
    steps: pd.DataFrame = run.steps
    dur = _Grid(steps, ("duration_s",)).matrix(steps["duration_s"])[two]  # the same grid as rank_work's
    w = w[two]
    scale = _row_quantile(dur, 0.5)
    excess_v = _excess(w, scale)
    if measure != "step time":
        excess_v = np.fmax(excess_v, _excess(dur, scale))
        measure = f"{measure}, or step time where longer"
    excess = pd.Series(excess_v, index=work.columns)
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
    return {"measure": measure, "steps": int(two.sum()), "ranks": ranks,
            "nodes": by_node, "node_stragglers": [str(n) for n in node_list],
            "rank_stragglers": [int(r) for r in rank_list]}


def run_stragglers(run: Any) -> dict[str, Any]:
    """The run's stragglers as every surface names them (the facts, the verdicts, the alerts):
    :func:`node_stragglers` over the nodes its ranks recorded (``run.rank_meta``). One rank: none."""
    return node_stragglers(run, rank_nodes(getattr(run, "rank_meta", {}) or {}))
