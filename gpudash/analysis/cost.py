"""What the run cost, and what the recommendations would save, in GPU-hours and money."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudash.analysis.verdict import Verdict, fmt_s, num
from gpudash.store.run import Run

__all__ = ["DEFAULT_PRICE_PER_HOUR", "Cost", "cost_verdict", "fmt_dollars", "fmt_gpu_hours", "run_cost"]

DEFAULT_PRICE_PER_HOUR = 2.50
"""US$ per GPU-hour; a mid-range cloud price for one data-centre GPU. Pass your own."""


@dataclass
class Cost:
    wall_s: float
    gpus: int
    gpu_hours: float
    price_per_hour: float
    device: str
    savings: list[tuple[str, float]] = field(default_factory=list)
    """(verdict title, GPU-hours saved: negative when the fix costs time)."""

    @property
    def dollars(self) -> float:
        return self.gpu_hours * self.price_per_hour


def fmt_gpu_hours(h: float) -> str:
    if abs(h) >= 0.1:
        return f"{h:.2f} GPU-hours"
    if abs(h) * 60 >= 0.1:
        return f"{h * 60:.2g} GPU-minutes"
    return f"{h * 3600:.2g} GPU-seconds"


def fmt_dollars(d: float) -> str:
    return f"${d:,.2f}" if abs(d) >= 0.01 else "< $0.01"


def _wall_s(run: Run) -> float:
    starts = [num(m.get("started_at")) for m in run.rank_meta.values()]
    ends = [num(m.get("ended_at")) or num(m.get("heartbeat")) for m in run.rank_meta.values()]
    s = [x for x in starts if x is not None]
    e = [x for x in ends if x is not None]
    if s and e and max(e) > min(s):
        return max(e) - min(s)
    st = run.steps
    if len(st) > 1:
        return float(st["time"].max() - st["time"].min() + st["duration_s"].iloc[0])
    return 0.0


def run_cost(run: Run, verdicts: list[Verdict] | None = None,
             price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> Cost:
    wall = _wall_s(run)
    gpus = max(1, int(num(run.meta.get("world_size")) or 1), len(run.ranks))
    c = Cost(wall_s=wall, gpus=gpus, gpu_hours=wall * gpus / 3600.0, price_per_hour=price_per_hour,
             device=str(run.meta.get("device_name") or run.meta.get("device") or "?"))
    for v in verdicts or []:
        frac = v.numbers.get("saving_fraction")
        if frac:
            c.savings.append((v.title, c.gpu_hours * frac))
    return c


def cost_verdict(run: Run, verdicts: list[Verdict], price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> Verdict:
    c = run_cost(run, verdicts, price_per_hour)
    ev = [f"{fmt_s(c.wall_s)} on {c.gpus} device(s) ({c.device}) = {fmt_gpu_hours(c.gpu_hours)} "
          f"at ${c.price_per_hour:.2f}/h = {fmt_dollars(c.dollars)}"]
    died = run.status == "crashed"
    if died:
        ev.append(f"the run crashed: its {fmt_gpu_hours(c.gpu_hours)} ({fmt_dollars(c.dollars)}) bought no finished model")
    total_saved = 0.0
    for title, h in c.savings:
        verb = "would save" if h > 0 else "would cost"
        ev.append(f"{title}: {verb} {fmt_gpu_hours(abs(h))} ({fmt_dollars(abs(h) * c.price_per_hour)}) "
                  "on a run like this")
        total_saved += h
    saving = None
    if total_saved > 0:
        saving = (f"{fmt_gpu_hours(total_saved)} ({fmt_dollars(total_saved * c.price_per_hour)}) "
                  "per run like this")
    return Verdict(kind="cost", title=f"Cost: {fmt_gpu_hours(c.gpu_hours)}, {fmt_dollars(c.dollars)}",
                   severity="warn" if died else "ok", evidence=ev, saving=saving,
                   numbers={"gpu_hours": c.gpu_hours, "wall_s": c.wall_s, "gpus": float(c.gpus),
                            "price_per_hour": c.price_per_hour, "dollars": c.dollars, "saved_gpu_hours": total_saved})
