"""``summarize(run)``: every verdict about a run, worst first.

The dashboard's summary panel, ``gpudash report`` and the notebook all call
this one function.
"""

from __future__ import annotations

from gpudash.analysis.bottleneck import bottleneck_verdicts
from gpudash.analysis.cost import DEFAULT_PRICE_PER_HOUR, cost_verdict
from gpudash.analysis.facts import step_count
from gpudash.analysis.hostmem import host_memory_verdicts, oom_kill_text, run_host_memory
from gpudash.analysis.memory import memory_verdicts
from gpudash.analysis.oom import oom_verdicts
from gpudash.analysis.recommend import recommend
from gpudash.analysis.stability import stability_verdicts
from gpudash.analysis.verdict import SEVERITY_ORDER, Verdict, fmt_pct
from gpudash.store.run import DIED, Run

__all__ = ["status_verdict", "straggler_verdicts", "summarize"]


def status_verdict(run: Run) -> Verdict:
    n = step_count(run.steps, run.meta)
    reason = str(run.meta.get("end_reason") or "")
    if run.status == "crashed":
        host = run_host_memory(run) if not reason or reason == DIED else None
        return Verdict(kind="status", title=f"Crashed after {n} steps", severity="bad",
                       evidence=[f"end reason: {oom_kill_text(host) if host and host.oom_killed else reason or DIED}"],
                       steps=(0, max(n - 1, 0)))
    if run.status == "live":
        return Verdict(kind="status", title=f"Still running ({n} steps so far)", severity="ok",
                       evidence=["the writer's heartbeat is recent: the analysis covers the steps so far"])
    ev = [f"{n} steps recorded"] + [f"damaged: {p}" for p in run.problems]
    if run.meta.get("steps_from"):  # gpudash run says how it counted them
        ev.insert(1, f"steps counted from {run.meta['steps_from']}")
    why = run.meta.get("no_steps_reason")
    if not n and why:  # said, never a silent "finished"
        return Verdict(kind="status", title="Finished without a step", severity="warn", evidence=[str(why), *ev[1:]])
    return Verdict(kind="status", title=f"Finished {n} steps", severity="warn" if run.problems else "ok", evidence=ev,
                   steps=(0, max(n - 1, 0)) if n else None)


def straggler_verdicts(run: Run) -> list[Verdict]:
    """The stragglers :class:`gpudash.analysis.facts.Facts` names (:func:`gpudash.analysis.ranks.run_stragglers`):
    a slow node once, and the slow ranks on otherwise healthy nodes."""
    if len(run.ranks) < 2:
        return []
    from gpudash.analysis.ranks import rank_skew, run_stragglers, straggler_summary

    found = run_stragglers(run)
    out = []
    if found["node_stragglers"]:  # a slow machine: said once, not once per rank on it
        by = found["nodes"]
        out = [Verdict(kind="straggler", title=f"Node {node} is a straggler (all {int(by.loc[node, 'ranks'])} of "
                                                 "its ranks)", severity="warn",
                        evidence=[f"every rank on {node} ends its own work {fmt_pct(by.loc[node, 'excess_median'])} "
                                  f"of a step after the fast ranks ({found['measure']}, median over "
                                  f"{found['steps']} steps)",
                                  "the ranks on the other nodes wait for it in the all-reduce"],
                        recommendation="one machine is slow, not one process: check that node's data path (local "
                                       "disk, network filesystem), network link, GPU clocks/throttling and other "
                                       "jobs on it",
                        numbers={"late_share_of_step": float(by.loc[node, "excess_median"])})
               for node in found["node_stragglers"]]
    slow = found["rank_stragglers"]  # slow ranks on otherwise healthy nodes
    if not slow:
        return out
    late = found["ranks"]["excess"]
    s = straggler_summary(rank_skew(run))
    evidence = [f"rank {r} ends its own work {fmt_pct(late.loc[r])} of a step after the fast ranks "
                f"({found['measure']}, median over {found['steps']} steps)" for r in slow[:8]]
    if s.get("skew_ratio_median") is not None:
        evidence.append(f"the slowest rank takes {fmt_pct(s['skew_ratio_median'])} longer than the median rank per "
                        f"step (p95 {fmt_pct(s.get('skew_ratio_p95'))})")
    title = f"Rank {slow[0]} is a straggler" if len(slow) == 1 else \
        f"Ranks {', '.join(map(str, slow[:8]))}{' and more' if len(slow) > 8 else ''} are stragglers"
    return [*out, Verdict(kind="straggler", title=title, severity="warn", evidence=evidence,
                          recommendation="every rank waits for the slowest in the all-reduce: check that rank's "
                                         "data loading, host and GPU clocks/throttling",
                          numbers={"late_share_of_step": float(late.loc[slow[0]]),
                                   "skew_ratio_median": float(s.get("skew_ratio_median") or 0.0),
                                   "stragglers": float(len(slow))})]


def summarize(run: Run, price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> list[Verdict]:
    """All verdicts about ``run`` with recommendations and savings, worst first, cost last."""
    verdicts = [status_verdict(run)]
    for analyse in (oom_verdicts, memory_verdicts, host_memory_verdicts, bottleneck_verdicts, stability_verdicts,
                    straggler_verdicts):
        try:
            verdicts += analyse(run)
        except Exception as exc:  # noqa: BLE001 - one analysis failing on a damaged run must not hide the others
            verdicts.append(Verdict(kind="analysis-error", title=f"{analyse.__name__} could not run",
                                    severity="warn", evidence=[f"{type(exc).__name__}: {exc}"]))
    recommend(run, verdicts)
    verdicts.sort(key=lambda v: (SEVERITY_ORDER[v.severity], v.kind != "status"))
    verdicts.append(cost_verdict(run, verdicts, price_per_hour))
    return verdicts
