"""The Ranks section at 64–256 ranks on several nodes: grouped by node, a heat map instead of one line per
rank, the slow node named once and the top stragglers listed."""

from __future__ import annotations

import numpy as np
import pandas as pd
from helpers.components import find

from gpudash.server.layouts import ranks


def ddp_frames(nodes: dict[int, str], slow: dict[int, float], steps: int = 20) -> pd.DataFrame:
    """Rows as DDP leaves them: each rank's data phase (0.02 s + its slowness), fast ranks waiting the
    difference inside backward, so every rank's step time is alike."""
    rng = np.random.default_rng(1)
    rows = []
    for step in range(steps):
        data = {r: 0.02 + slow.get(r, 0.0) + rng.uniform(0, 0.001) for r in nodes}
        latest = max(data.values())
        for r in nodes:
            backward = 0.03 + latest - data[r]
            rows.append({"rank": r, "step": step, "time": float(step), "data_s": data[r], "forward_s": 0.01,
                         "backward_s": backward, "optimizer_s": 0.005, "samples": 8.0,
                         "duration_s": data[r] + 0.01 + backward + 0.005})
    return pd.DataFrame(rows)


NODES_64 = {r: f"node{r // 8:02d}" for r in range(64)}


def test_64_ranks_on_8_nodes_name_the_slow_node_once() -> None:
    steps = ddp_frames(NODES_64, {r: 0.015 for r in range(24, 32)} | {50: 0.02})
    box = ranks.ranks_box(steps, pd.DataFrame(), NODES_64)
    section = box[0]
    assert find(section, "rank-heatmap") is not None and find(section, "rank-step-graph") is None
    top = str(find(section, "top-stragglers"))
    assert "node node03: all 8 ranks (24–31)" in top and "rank 50 on node06" in top
    assert "rank 24" not in top  # the slow node's ranks are not listed one by one
    nodes_table = find(section, "nodes-table")
    rows = {r["node"]: r for r in nodes_table.data}  # type: ignore[attr-defined]
    assert len(rows) == 8 and rows["node03"]["straggler"] == "whole node" and rows["node03"]["ranks"] == "24–31"
    assert rows["node06"]["straggler"] == "some ranks" and rows["node00"]["straggler"] == "-"
    lights = {name: (color, detail) for name, color, detail in ranks.straggler_lights(steps, pd.DataFrame(),
                                                                                       NODES_64)}
    color, detail = lights["node straggler"]
    assert color in ("amber", "red") and detail.startswith("node node03 (all 8 ranks, ")
    assert detail.endswith("% of a step late)")
    late = float(detail.split(", ")[1].split()[0])
    assert 12 <= late <= 20  # 15 ms late of a ~80 ms step
    assert lights["straggler"][1] == detail  # the headline names the node, not eight ranks


def test_heatmap_groups_ranks_by_node_and_bins_long_runs() -> None:
    nodes = {r: f"n{(r % 32):02d}" for r in range(256)}  # ranks interleaved across 32 nodes
    steps = ddp_frames(nodes, {}, steps=2 * ranks.HEATMAP_STEPS + 5)
    fig = ranks.rank_heatmap_figure(steps, nodes)
    (trace,) = fig.data
    assert trace.type == "heatmap"
    assert len(trace.y) == 256 and trace.y[:2] == ["n00 · 0", "n00 · 32"] and trace.y[8] == "n01 · 1"
    assert len(trace.x) <= ranks.HEATMAP_STEPS and trace.x[0] == 0
    assert len(trace.z) == 256 and all(len(row) == len(trace.x) for row in trace.z)
    # time outside backward: the data phase and the rest, about 0.035 s, not the ~0.065 s step
    assert 0.034 < float(np.nanmedian(np.array(trace.z, dtype=float))) < 0.037
    assert "outside backward" in fig.layout.title["text"]
    boundaries = [s for s in fig.layout.shapes if s["type"] == "line"]
    assert len(boundaries) == 31


def test_two_ranks_on_two_nodes_keep_lines_and_gain_a_node_column() -> None:
    nodes = {0: "alpha", 1: "beta"}
    steps = ddp_frames(nodes, {1: 0.03})
    rows = ranks.rank_rows(steps, pd.DataFrame(), nodes)
    assert [(r["node"], r["rank"]) for r in rows] == [("alpha", 0), ("beta", 1)]
    section = ranks.ranks_box(steps, pd.DataFrame(), nodes)[0]
    assert find(section, "rank-step-graph") is not None and find(section, "rank-heatmap") is None
    assert "node beta: all 1 ranks (1)" in str(find(section, "top-stragglers"))


def test_one_node_many_ranks_lists_rank_stragglers() -> None:
    nodes = {r: "solo" for r in range(16)}
    steps = ddp_frames(nodes, {3: 0.02, 9: 0.01})
    section = ranks.ranks_box(steps, pd.DataFrame(), nodes)[0]
    assert find(section, "nodes-table") is None  # one node: nothing to compare
    top = str(find(section, "top-stragglers"))
    assert top.index("rank 3 on solo") < top.index("rank 9 on solo")
    assert "node" not in ranks.rank_rows(steps, pd.DataFrame(), nodes)[0]
