"""``gpudash check RUN [--baseline RUN2] [rules]``: gate a run in CI on the facts the report shows.

    gpudash check runs/pr --baseline runs/main --max-peak-increase 5% --max-step-time-increase 10% --no-nonfinite
    gpudash check runs/pr --baseline runs/main --rules gates.toml --json

Exit 0: every rule holds; 1: a rule is broken (one line each); 2: bad input (a missing run, a bad flag or
rules file, a number the run did not record), one line. The numbers are the run's facts
(:func:`gpudash.analysis.facts.run_facts`): the peak is ``headline.peak_memory_bytes``, the step time the
median step time, as ``gpudash report`` and ``gpudash info`` print them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpudash.errors import UserError
from gpudash.terminal import printable

__all__ = ["GateRules", "Outcome", "add_arguments", "check", "load_rules", "parse_percent", "run"]


#: The largest rules file read (a real one is a few lines).
RULES_BYTES = 1 << 20


def _shown(v: Any) -> str:
    """A rule's bad value in a one-line message: short, its type named when it is not a number or text."""
    if isinstance(v, str):
        text = repr(v)
    elif isinstance(v, (bool, int, float)):
        text = repr(v)
    else:
        text = f"(a {type(v).__name__})"
    return text if len(text) <= 60 else text[:57] + "..."


def parse_percent(text: Any, what: str = "value") -> float:
    """``"5%"``, ``"5"`` or ``5`` -> 5.0 (percent); ValueError names the value."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{what} {_shown(text)}: expected a percentage like 5%")
    s = str(text).strip().removesuffix("%").strip()
    try:
        x = float(s)
    except ValueError:
        raise ValueError(f"{what} {_shown(text)}: expected a percentage like 5%") from None
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} {_shown(text)}: expected a finite percentage >= 0")
    return x


def _pct_arg(text: str) -> float:
    try:
        return parse_percent(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(kw_only=True, slots=True)
class GateRules:
    """The rules a run must keep (None / False: not checked)."""

    max_peak_increase: float | None = None
    """Peak memory may grow at most this many percent over the baseline's."""
    max_step_time_increase: float | None = None
    """The median step time may grow at most this many percent over the baseline's."""
    max_peak_gib: float | None = None
    """Peak memory at most this many GiB (1024^3 bytes)."""
    no_nonfinite: bool = False
    """No non-finite (NaN/Inf) step."""
    no_oom: bool = False
    """No OOM (recovered or not)."""
    max_spikes: int | None = None
    """At most this many loss spikes."""
    no_leak: bool = False
    """No leak: memory held between steps that grows step after step (the run's leak fact)."""
    max_wh_per_mtok: float | None = None
    """Energy at most this many watt-hours per million tokens (the run's energy fact)."""
    baseline: str | None = None
    """The baseline run (a rules file's is relative to the file)."""

    def __post_init__(self) -> None:
        for name in ("max_peak_increase", "max_step_time_increase"):
            v = getattr(self, name)
            if v is not None:
                setattr(self, name, parse_percent(v, name))
        if self.max_peak_gib is not None and (not isinstance(self.max_peak_gib, int | float)
                                              or isinstance(self.max_peak_gib, bool)
                                              or not math.isfinite(self.max_peak_gib) or self.max_peak_gib <= 0):
            raise ValueError(f"max_peak_gib {_shown(self.max_peak_gib)}: expected a finite number of GiB > 0")
        if self.max_wh_per_mtok is not None and (not isinstance(self.max_wh_per_mtok, int | float)
                                                 or isinstance(self.max_wh_per_mtok, bool)
                                                 or not math.isfinite(self.max_wh_per_mtok)
                                                 or self.max_wh_per_mtok <= 0):
            raise ValueError(f"max_wh_per_mtok {_shown(self.max_wh_per_mtok)}: expected a finite number of Wh > 0")
        if self.max_spikes is not None and (not isinstance(self.max_spikes, int) or isinstance(self.max_spikes, bool)
                                            or self.max_spikes < 0):
            raise ValueError(f"max_spikes {_shown(self.max_spikes)}: expected a whole number >= 0")
        for name in ("no_nonfinite", "no_oom", "no_leak"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {_shown(getattr(self, name))}: expected true or false")
        if self.baseline is not None and (not isinstance(self.baseline, str) or not self.baseline.strip()):
            raise ValueError(f"baseline {_shown(self.baseline)}: expected the path of a run folder, as text")

    def any(self) -> bool:
        return any(getattr(self, f.name) not in (None, False) for f in fields(self) if f.name != "baseline")


# ---- the rules file (TOML) ---------------------------------------------------------------------------
def _read_toml(path: Path) -> dict[str, Any]:
    """The rules file as TOML: the standard library's reader (3.11+), ``tomli`` (the same code) on 3.10."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # a dependency there (pyproject: tomli; python_version < "3.11")
        import tomli as tomllib
    from gpudash.store.bounded import read_regular

    data: dict[str, Any] = tomllib.loads(read_regular(path, RULES_BYTES).decode("utf-8"))
    return data


def load_rules(path: Path) -> GateRules:
    """A rules file: the flags' names as keys (``max_peak_increase = "5%"``, ``no_oom = true``), at the top
    or under ``[check]``. Raises UserError with one line."""
    try:
        data = _read_toml(path)
    except OSError as exc:
        raise UserError(f"--rules {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError (and UnicodeDecodeError)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--rules {path}: not valid TOML ({first[:200]})") from None
    except (RecursionError, MemoryError):
        raise UserError(f"--rules {path}: nested too deeply to read (a rules file is a few flat lines: "
                        "max_peak_increase = \"5%\", no_oom = true)") from None
    if isinstance(data.get("check"), dict):
        data = data["check"]
    known = {f.name for f in fields(GateRules)}
    items = {k.replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(items) - known)
    if unknown:
        raise UserError(f"--rules {path}: unknown rule(s) {', '.join(unknown)}; use {', '.join(sorted(known))}")
    if isinstance(items.get("baseline"), str):
        items["baseline"] = str(path.parent / items["baseline"])
    try:
        return GateRules(**items)
    except (ValueError, TypeError, RecursionError) as exc:
        raise UserError(f"--rules {path}: {exc}") from None


# ---- judging -------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    rule: str
    passed: bool
    text: str
    value: float | None = None
    limit: float | None = None
    baseline: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "passed": self.passed, "text": self.text, "value": self.value,
                "limit": self.limit, "baseline": self.baseline}


def _need(value: float | None, what: str, run: str) -> float:
    if value is None:
        raise UserError(f"{run}: records no {what}, so the rule cannot be checked (record memory / steps, "
                        "or drop the rule)")
    return float(value)


def check(facts: Any, rules: GateRules, base: Any = None, run: str = "run", baseline: str = "baseline") -> list[Outcome]:
    """Each rule against ``facts`` (and ``base``, the baseline's facts). Raises UserError when a number a
    rule needs is missing. A run that recorded no step fails (the ``steps`` outcome, with its reason)."""
    from gpudash.analysis.verdict import fmt_s
    from gpudash.units import GiB, given, human_bytes

    out: list[Outcome] = []
    if not facts.steps:  # nothing to judge: a run without a step never passes a gate
        # why, when known: what gpudash run said, else how the run ended (the OOM killer can take a process
        # before its first steps leave the writer's queue)
        why = facts.no_steps_reason or facts.end_reason or "nothing was recorded"
        return [Outcome("steps", False, f"{run} recorded no step: {why}", value=0.0, limit=1.0)]
    h, bh = facts.headline, (base.headline if base is not None else {})

    def growth(rule: str, key: str, what: str, fmt: Any, limit: float) -> None:
        if base is None:
            raise UserError(f"--{rule.replace('_', '-')} needs --baseline RUN (or baseline = \"...\" in --rules)")
        v, b = _need(h.get(key), what, run), _need(bh.get(key), what, baseline)
        pct = 100.0 * (v / b - 1.0) if b > 0 else (0.0 if v == 0 else float("inf"))
        ok = pct <= limit + 1e-9
        out.append(Outcome(rule, ok, f"{what} {fmt(v)} is {pct:+.1f} % against the baseline's {fmt(b)} "
                                     f"(limit +{limit:g} %)", value=v, limit=limit, baseline=b,
                           extra={"increase_pct": pct}))

    if rules.max_peak_increase is not None:
        growth("max_peak_increase", "peak_memory_bytes", "peak memory", human_bytes, rules.max_peak_increase)
    if rules.max_step_time_increase is not None:
        growth("max_step_time_increase", "step_time_median_s", "median step time", fmt_s,
               rules.max_step_time_increase)
    if rules.max_peak_gib is not None:
        v = _need(h.get("peak_memory_bytes"), "peak memory", run)
        limit = rules.max_peak_gib * GiB
        out.append(Outcome("max_peak_gib", v <= limit, f"peak memory {human_bytes(v)} (limit {given(rules.max_peak_gib, 'GiB')})",
                           value=v, limit=limit))
    if rules.no_nonfinite:
        nf = facts.nonfinite_steps
        out.append(Outcome("no_nonfinite", not nf, f"{len(nf)} non-finite step(s)"
                           + (f", the first at step {nf[0]}" if nf else ""), value=float(len(nf)), limit=0.0))
    if rules.no_oom:  # the device's OOMs and the kernel's OOM killer taking the run (host memory)
        killed = facts.host_memory is not None and facts.host_memory.oom_killed
        n = facts.oom_count + int(killed)
        out.append(Outcome("no_oom", n == 0, f"{facts.oom_count} OOM(s)"
                           + ("; killed by the kernel's OOM killer (host memory)" if killed else ""),
                           value=float(n), limit=0.0))
    if rules.max_spikes is not None:
        sp = facts.loss_spike_steps
        out.append(Outcome("max_spikes", len(sp) <= rules.max_spikes,
                           f"{len(sp)} loss spike(s)" + (f" (steps {', '.join(map(str, sp[:8]))})" if sp else "")
                           + f" (limit {rules.max_spikes})", value=float(len(sp)), limit=float(rules.max_spikes)))
    if rules.no_leak:
        from gpudash.analysis.leak import leak_text

        lk = facts.leak
        out.append(Outcome("no_leak", lk is None, "no leak" if lk is None else leak_text(lk),
                           value=None if lk is None else float(lk.per_step_bytes), limit=0.0))
    if rules.max_wh_per_mtok is not None:
        e = facts.energy
        wh = _need(None if e is None else e.wh_per_mtok, "energy per token (an energy source and tokens per step)",
                   run)
        out.append(Outcome("max_wh_per_mtok", wh <= rules.max_wh_per_mtok,
                           f"{wh:.3g} Wh per million tokens (limit {rules.max_wh_per_mtok:g})", value=wh,
                           limit=float(rules.max_wh_per_mtok)))
    return out


# ---- the command -----------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", type=Path, help="the run to check")
    p.add_argument("--baseline", type=Path, default=None, help="the run to compare against")
    p.add_argument("--max-peak-increase", type=_pct_arg, default=None, metavar="PCT",
                   help="fail if peak memory grew more than PCT over the baseline's (e.g. 5%%)")
    p.add_argument("--max-step-time-increase", type=_pct_arg, default=None, metavar="PCT",
                   help="fail if the median step time grew more than PCT over the baseline's (e.g. 10%%)")
    p.add_argument("--max-peak-gib", type=float, default=None, metavar="GIB", help="fail if peak memory exceeds GIB")
    p.add_argument("--no-nonfinite", action="store_true", default=None, help="fail on any non-finite (NaN/Inf) step")
    p.add_argument("--no-oom", action="store_true", default=None, help="fail on any OOM")
    p.add_argument("--no-leak", action="store_true", default=None,
                   help="fail when memory held between steps grows step after step (a leak)")
    p.add_argument("--max-wh-per-mtok", type=float, default=None, metavar="WH",
                   help="fail if the run drew more than WH watt-hours per million tokens")
    p.add_argument("--max-spikes", type=int, default=None, metavar="N", help="fail on more than N loss spikes")
    p.add_argument("--rules", type=Path, default=None, metavar="FILE",
                   help="rules from a TOML file (same names: max_peak_increase = \"5%%\", no_oom = true, "
                        "baseline = \"../main\"); flags override it")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _rules(args: argparse.Namespace) -> GateRules:
    rules = load_rules(args.rules) if args.rules is not None else GateRules()
    for f in fields(GateRules):
        v = getattr(args, f.name, None)
        if v is not None:
            setattr(rules, f.name, str(v) if f.name == "baseline" else v)
    try:
        rules.__post_init__()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not rules.any():
        raise UserError("no rules to check: pass e.g. --max-peak-increase 5% --no-nonfinite, or --rules gates.toml")
    return rules


def _facts(path: Path, what: str) -> Any:
    from gpudash.analysis.facts import run_facts
    from gpudash.store import load_run

    if not path.exists():
        raise UserError(f"{what} {path}: no such run directory (pass the run folder gpudash recorded)")
    r = load_run(path)
    try:
        return run_facts(r)
    finally:
        r.close()


def run(args: argparse.Namespace) -> int:
    rules = _rules(args)
    facts = _facts(args.run, "run")
    base = _facts(Path(rules.baseline), "--baseline") if rules.baseline else None
    outcomes = check(facts, rules, base, run=str(args.run), baseline=str(rules.baseline))
    broken = [o for o in outcomes if not o.passed]
    if args.json:
        print(json.dumps({"run": str(args.run), "baseline": rules.baseline, "passed": not broken,
                          "rules": [o.as_dict() for o in outcomes]}, indent=2, allow_nan=False,
                         default=lambda v: None))
    else:
        for o in broken:
            print(printable(f"FAIL {o.rule}: {o.text}"))
        if not broken:
            print(printable(f"ok: {len(outcomes)} rule(s) hold for {args.run}"
                            + (f" against {rules.baseline}" if rules.baseline else "")))
    sys.stdout.flush()
    return 1 if broken else 0
