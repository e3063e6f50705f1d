"""Ranks grouped by node: a slow machine is one node straggler, not one straggler per rank."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from gpudash.analysis.ranks import node_stragglers, rank_nodes, rank_work


def ddp_steps(nodes: dict[int, str], slow: dict[int, float], steps: int = 30, seed: int = 0) -> pd.DataFrame:
    """DDP-like rows: each rank's data phase takes 0.02 s (+ its slowness); every rank's step ends at the
    all-reduce, so fast ranks wait the difference inside backward and all step times are alike."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        data = {r: 0.02 + slow.get(r, 0.0) + rng.uniform(0, 0.001) for r in nodes}
        latest = max(data.values())
        for r in nodes:
            fwd, opt = 0.01, 0.005
            backward = 0.03 + (latest - data[r])  # waits for the slowest rank
            rows.append({"rank": r, "step": step, "data_s": data[r], "forward_s": fwd, "backward_s": backward,
                         "optimizer_s": opt, "duration_s": data[r] + fwd + backward + opt})
    return pd.DataFrame(rows)


def run_of(nodes: dict[int, str], slow: dict[int, float]) -> SimpleNamespace:
    return SimpleNamespace(steps=ddp_steps(nodes, slow), memory=pd.DataFrame(),
                           rank_meta={r: {"node": n, "local_rank": r % 4} for r, n in nodes.items()})


TWO_NODES = {r: ("node-a" if r < 4 else "node-b") for r in range(8)}


def test_a_slow_node_is_one_node_straggler_not_four_rank_stragglers() -> None:
    run = run_of(TWO_NODES, {r: 0.02 for r in range(4, 8)})
    # all step times are alike under DDP: the step time alone cannot tell who is slow
    d = run.steps.groupby("rank")["duration_s"].median()
    assert d.max() / d.min() - 1 < 0.05
    s = node_stragglers(run)
    assert s["node_stragglers"] == ["node-b"]
    assert s["rank_stragglers"] == []
    assert s["measure"] == "step time outside backward, or step time where longer"
    assert bool(s["nodes"].loc["node-b", "straggler"]) and not bool(s["nodes"].loc["node-a", "straggler"])
    assert (s["ranks"].loc[4:7, "straggler"] == "node").all()
    assert s["ranks"].loc[0:3, "straggler"].isna().all()


def test_one_slow_rank_on_a_healthy_node_is_a_rank_straggler() -> None:
    run = run_of(TWO_NODES, {5: 0.02})
    s = node_stragglers(run)
    assert s["node_stragglers"] == [] and s["rank_stragglers"] == [5]


def test_a_node_with_one_rank_that_is_slow_is_a_node_straggler() -> None:
    nodes = {0: "a", 1: "a", 2: "b"}
    s = node_stragglers(run_of(nodes, {2: 0.03}))
    assert s["node_stragglers"] == ["b"] and s["rank_stragglers"] == []


def test_healthy_run_has_no_straggler() -> None:
    s = node_stragglers(run_of(TWO_NODES, {}))
    assert s["node_stragglers"] == [] and s["rank_stragglers"] == []
    assert s["steps"] == 30


def test_one_node_all_ranks_slow_elsewhere_nothing_to_compare() -> None:
    # every rank on the only node equally slow: nobody is late relative to anyone
    s = node_stragglers(run_of({r: "a" for r in range(4)}, {r: 0.05 for r in range(4)}))
    assert s["node_stragglers"] == [] and s["rank_stragglers"] == []


def test_without_phases_the_step_time_is_measured() -> None:
    steps = ddp_steps(TWO_NODES, {}).drop(columns=["backward_s"])
    steps.loc[steps["rank"] == 6, "duration_s"] *= 1.5
    run = SimpleNamespace(steps=steps, memory=pd.DataFrame(), rank_meta={r: {"node": n} for r, n in TWO_NODES.items()})
    assert rank_work(run).attrs["measure"] == "step time"
    assert node_stragglers(run)["rank_stragglers"] == [6]


def test_rank_nodes_falls_back_to_hostname_and_host() -> None:
    meta = {0: {"node": "n0", "hostname": "h0"}, 1: {"hostname": "h1"}, 2: {"host": "x"}, 3: {"node": 5}, 4: {}}
    assert rank_nodes(meta) == {0: "n0", 1: "h1", 2: "x", 3: "?", 4: "?"}


def test_single_rank_and_empty_runs() -> None:
    empty = SimpleNamespace(steps=pd.DataFrame(), memory=pd.DataFrame(), rank_meta={})
    assert node_stragglers(empty)["steps"] == 0
    one = run_of({0: "a"}, {})
    assert node_stragglers(one)["node_stragglers"] == []


@pytest.mark.parametrize("ranks", [64, 256])
def test_many_ranks_name_the_slow_node(ranks: int) -> None:
    nodes = {r: f"node{r // 8:02d}" for r in range(ranks)}
    s = node_stragglers(run_of(nodes, {r: 0.015 for r in range(16, 24)} | {40: 0.02}))
    assert s["node_stragglers"] == ["node02"]
    assert s["rank_stragglers"] == [40]


def test_the_verdict_names_the_slow_node_once() -> None:
    from gpudash.analysis.summary import straggler_verdicts

    run = run_of(TWO_NODES, {r: 0.02 for r in range(4, 8)})
    run.ranks = list(TWO_NODES)
    (v,) = straggler_verdicts(run)  # type: ignore[arg-type]
    assert v.title == "Node node-b is a straggler (all 4 of its ranks)"
    assert "step time outside backward" in v.evidence[0]


def test_the_verdict_names_the_ranks_the_facts_name() -> None:
    """Under DDP every rank's step time is alike (the fast ones wait in backward): the verdict once judged the
    step-time skew and said nothing of a rank the facts named a straggler. Kept: the facts' rule (own work,
    :func:`gpudash.analysis.ranks.run_stragglers`), one answer for the facts, the verdicts and the alerts."""
    from gpudash.analysis.ranks import rank_skew, run_stragglers, straggler_summary
    from gpudash.analysis.summary import straggler_verdicts

    run = run_of(TWO_NODES, {5: 0.02})
    run.ranks = list(TWO_NODES)
    assert (straggler_summary(rank_skew(run)).get("skew_ratio_median") or 0.0) < 0.1  # the old rule: nothing
    found = run_stragglers(run)
    assert found["rank_stragglers"] == [5] and found["node_stragglers"] == []
    (v,) = straggler_verdicts(run)  # type: ignore[arg-type]
    assert v.title == "Rank 5 is a straggler" and v.numbers["late_share_of_step"] > 0.1
    # a slow node and a slow rank elsewhere: both, as the facts' headline row names them
    run = run_of({r: f"node{r // 8:02d}" for r in range(64)}, {r: 0.015 for r in range(16, 24)} | {40: 0.02})
    run.ranks = list(range(64))
    assert [v.title for v in straggler_verdicts(run)] == [  # type: ignore[arg-type]
        "Node node02 is a straggler (all 8 of its ranks)", "Rank 40 is a straggler"]


def test_a_rank_slow_in_backward_itself_is_named() -> None:
    """Ranks that do not wait for each other (no all-reduce): rank 3's backward takes 4x as long, so do its
    steps. The time outside backward is alike on every rank; the step time names it."""
    rows = [{"rank": r, "step": s, "data_s": 0.01, "forward_s": 0.02, "backward_s": 0.04 * (4 if r == 3 else 1),
             "duration_s": 0.03 + 0.04 * (4 if r == 3 else 1) + 0.0001 * ((r + s) % 3)}
            for r in range(8) for s in range(50)]
    run = SimpleNamespace(steps=pd.DataFrame(rows), memory=pd.DataFrame(),
                          rank_meta={r: {"node": TWO_NODES[r]} for r in range(8)})
    s = node_stragglers(run)
    assert s["rank_stragglers"] == [3] and s["node_stragglers"] == []
    assert s["ranks"].loc[3, "excess"] == pytest.approx(0.12 / 0.0701, rel=0.01)
