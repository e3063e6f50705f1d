"""The microbenchmark's step counted in CPU instructions (Valgrind's callgrind), next to wandb and trackio.

    .venv-bench/bin/python benchmarks/step_instructions.py [--steps 2000 12000]

Part 5 of ``overhead.py`` times the microbenchmark (step + 4 phases + 8 scalars, no body) on the training
thread's CPU clock; on a shared VM that clock's median moves 40-60 % between two runs of the same code, more
than the 1-2 µs a change to the hot path makes. This counts instead: each variant runs in its own process
under callgrind (``--separate-threads=yes``) twice, for two numbers of steps after the same warm-up, and the
difference of the two counts over the difference of the steps is the instructions one step costs, thread by
thread. Start-up (imports, the run's files) is in both runs and cancels out. The same count on any x86 CPU;
what an instruction costs in time is the machine's (a ratio to the floor's count carries over: on a machine
where the floor runs at F µs a step, a variant at k x the floor's count runs at about k x F).

Variants: bare (the 8 scalars' dict only, what every logger is handed), the floor (the same five ``with``
and one ``log(**)`` as a minimal pure-Python logger that fills a dict and keeps nothing: ``overhead._Floor``),
gpudash (``Monitor``, defaults but no host sampling and no leak watch, which run on their own threads at a
fixed rate), gpudash with its rows handed nowhere (the training thread's own work without the hand-over),
and, when installed, wandb (offline) and trackio logging the same 8 scalars.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("bare", "floor", "gpudash", "gpudash, rows handed nowhere", "wandb (offline)", "trackio")
WARMUP = 200


def child(variant: str, steps: int, tmp: Path) -> None:
    """Run ``variant`` for ``WARMUP`` then ``steps`` steps (in the process callgrind watches)."""
    from benchmarks.overhead import _Floor, scalars

    def mb_step(mon: object, i: int) -> None:
        with mon.step(samples=8, tokens=1024):  # type: ignore[attr-defined]
            with mon.phase("data"):  # type: ignore[attr-defined]
                pass
            with mon.phase("forward"):  # type: ignore[attr-defined]
                pass
            with mon.phase("backward"):  # type: ignore[attr-defined]
                pass
            with mon.phase("optimizer"):  # type: ignore[attr-defined]
                pass
            mon.log(**scalars(i))  # type: ignore[attr-defined]

    close = None
    if variant == "bare":
        ctx: object = None

        def body(_ctx: object, i: int) -> None:
            scalars(i)
    elif variant == "floor":
        ctx, body = _Floor(), mb_step
    elif variant.startswith("gpudash"):
        from gpudash.monitor import Monitor

        mon = Monitor(tmp / "run", host_hz=0, leak_poll_s=0)
        if variant != "gpudash":
            mon._put_step = lambda row: None  # type: ignore[method-assign]
        ctx, body, close = mon, mb_step, mon.close
    elif variant.startswith("wandb"):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run = wandb.init(mode="offline", dir=str(tmp), project="bench", name="instr",
                         settings=wandb.Settings(console="off"))
        ctx, close = run, run.finish

        def body(r: object, i: int) -> None:
            r.log(scalars(i))  # type: ignore[attr-defined]
    else:
        os.environ["TRACKIO_DIR"] = str(tmp / "trackio")
        import trackio

        trackio.init(project="bench", name="instr")
        ctx, close = trackio, trackio.finish

        def body(r: object, i: int) -> None:
            r.log(scalars(i))  # type: ignore[attr-defined]
    for i in range(WARMUP + steps):
        body(ctx, i)
    if close is not None:
        close()


def _counts(prefix: str) -> tuple[int, int]:
    """Instructions of the main thread, and of every other thread, from callgrind's per-thread files."""
    main = rest = 0
    for f in glob.glob(prefix + "*"):
        m = re.search(r"-(\d+)$", f)
        text = Path(f).read_text(errors="replace")
        tot = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
        n = int(tot.group(1)) if tot else 0
        if m and int(m.group(1)) == 1:
            main += n
        else:
            rest += n
    return main, rest


def measure(variant: str, lo: int, hi: int, tmp: Path) -> tuple[float, float] | None:
    """Instructions a step on the training thread and on the others, or None when the variant cannot run."""
    got = []
    for steps in (lo, hi):
        prefix = str(tmp / f"cg.{VARIANTS.index(variant)}.{steps}.")
        work = tmp / f"w{VARIANTS.index(variant)}.{steps}"
        work.mkdir()
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={prefix}%p",
             sys.executable, __file__, "--child", variant, str(steps), str(work)],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{variant}: not measured ({tail[:160]})")
            return None
        got.append(_counts(prefix))
    (m0, r0), (m1, r1) = got
    return (m1 - m0) / (hi - lo), (r1 - r0) / (hi - lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs=2, default=(2000, 12000), metavar=("LO", "HI"),
                    help="the two numbers of steps counted (default 2000 12000)")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="measure only the variants whose name starts with one of these (e.g. bare floor gpudash)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), Path(args.child[2]))
        return
    if shutil.which("valgrind") is None:
        sys.exit("step_instructions.py: valgrind is not installed (apt-get install valgrind)")
    lo, hi = args.steps
    if not 0 <= lo < hi:
        sys.exit("step_instructions.py: --steps LO HI needs 0 <= LO < HI")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpudash-instr-") as t:
        for v in VARIANTS:
            if args.only and not any(v.startswith(o) for o in args.only):
                continue
            got = measure(v, lo, hi, Path(t))
            if got is not None:
                rows.append((v, *got))
    print(f"{platform.machine()}, python {platform.python_version()}, callgrind, steps {lo:,} and {hi:,}")
    base = dict((v, m) for v, m, _ in rows)
    print("| variant | instructions a step, training thread | over bare | x the floor's (over bare) | "
          "other threads, a step |")
    print("|---|---:|---:|---:|---:|")
    for v, m, r in rows:
        over = m - base.get("bare", 0.0)
        floor = base.get("floor", 0.0) - base.get("bare", 0.0)
        ratio = f"{over / floor:.2f}" if floor > 0 and v != "bare" else ""
        print(f"| {v} | {m:,.0f} | {over:,.0f} | {ratio} | {r:,.0f} |")


if __name__ == "__main__":
    main()
