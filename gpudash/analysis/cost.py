"""What the run cost, and what the recommendations would save, in GPU-hours and money.

Only a run on a GPU has a GPU price: a CPU run's cost is its time (and what the recommendations would
save of it), never GPU-minutes at $/h."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudash.analysis.verdict import Verdict, fmt_s, num
from gpudash.store.run import Run

__all__ = ["DEFAULT_PRICE_PER_HOUR", "Cost", "cost_verdict", "fmt_dollars", "fmt_gpu_hours", "on_gpu", "run_cost"]

DEFAULT_PRICE_PER_HOUR = 2.50
"""US$ per GPU-hour; a mid-range cloud price for one data-centre GPU. Pass your own."""


@dataclass
class Cost:
    wall_s: float
    gpus: int
    gpu_hours: float
    price_per_hour: float
    device: str
    gpu: bool = True
    """The run used a GPU (else ``gpu_hours`` is 0 and only the time counts)."""
    savings: list[tuple[str, float]] = field(default_factory=list)
    """(verdict title, GPU-hours saved, or on a CPU run seconds saved: negative when the fix costs time)."""

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
    start = run.start
    ends = [num(m.get("ended_at")) or num(m.get("heartbeat")) for m in run.rank_meta.values()]
    e = [x for x in ends if x is not None]
    if start is not None and e and max(e) > start:
        return max(e) - start
    st = run.steps
    if len(st) > 1:
        return float(st["time"].max() - st["time"].min() + st["duration_s"].iloc[0])
    return 0.0


def on_gpu(run: Run) -> bool:
    """The run trained on a CUDA device (its meta names one, or its capacity), on any rank."""
    metas = [run.meta, *run.rank_meta.values()]
    return any(str(m.get("device") or "").startswith("cuda:") or num(m.get("device_capacity_bytes")) is not None
               for m in metas)


def run_cost(run: Run, verdicts: list[Verdict] | None = None,
             price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> Cost:
    wall = _wall_s(run)
    gpus = max(1, int(num(run.meta.get("world_size")) or 1), len(run.ranks))
    gpu = on_gpu(run)
    c = Cost(wall_s=wall, gpus=gpus, gpu_hours=wall * gpus / 3600.0 if gpu else 0.0, price_per_hour=price_per_hour,
             device=str(run.meta.get("device_name") or run.meta.get("device") or "?"), gpu=gpu)
    for v in verdicts or []:
        frac = v.numbers.get("saving_fraction")
        if frac:
            c.savings.append((v.title, (c.gpu_hours if gpu else wall) * frac))
    return c


def _cpu_verdict(run: Run, c: Cost) -> Verdict:
    ev = [f"{fmt_s(c.wall_s)} on {c.gpus} CPU process(es) ({c.device}): no GPU, so no GPU price"]
    if run.status == "crashed":
        ev.append(f"the run crashed: its {fmt_s(c.wall_s)} bought no finished model")
    saved = 0.0
    for title, secs in c.savings:
        ev.append(f"{title}: {'would save' if secs > 0 else 'would cost'} {fmt_s(abs(secs))} on a run like this")
        saved += secs
    return Verdict(kind="cost", title=f"Time: {fmt_s(c.wall_s)} on the CPU", severity="warn" if run.status == "crashed"
                   else "ok", evidence=ev, saving=f"{fmt_s(saved)} per run like this" if saved > 0 else None,
                   numbers={"gpu_hours": 0.0, "wall_s": c.wall_s, "gpus": 0.0, "price_per_hour": c.price_per_hour,
                            "dollars": 0.0, "saved_gpu_hours": 0.0, "saved_s": saved})


def cost_verdict(run: Run, verdicts: list[Verdict], price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> Verdict:
    v = _cost_verdict(run, verdicts, price_per_hour)
    from gpudash.analysis.energy import energy_text, run_energy
    from gpudash.analysis.facts import step_count

    e = run_energy(run, step_count(run.steps, run.meta))
    if e is not None:  # the energy beside the money
        v.evidence.append(f"energy: {energy_text(e)}")
        v.numbers["energy_j"] = e.total_j
    return v


def _cost_verdict(run: Run, verdicts: list[Verdict], price_per_hour: float) -> Verdict:
    c = run_cost(run, verdicts, price_per_hour)
    if not c.gpu:
        return _cpu_verdict(run, c)
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
