"""Strategy matrix: checkpointing x precision x offload on one preset.

Each cell is a gpudash run (open them side by side in the dashboard's compare
view); the table gives memory by category as the Monitor measured it and the
median step time relative to the plain fp32 cell.

    .venv/bin/python benchmarks/strategies.py                 # CPU: tiny preset, seq 128
    .venv/bin/python benchmarks/strategies.py --write         # also update benchmarks/RESULTS.md
    python benchmarks/strategies.py --preset gpt2-124m --batch 8 --seq-len 1024   # on a GPU

On CPU, "memory" is the sum of the Monitor's categories (parameters,
gradients, optimizer state, saved activations): there is no allocator peak.
On a GPU the allocator's per-step peak (``peak_bytes``) is shown too.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import results
import torch

import gpudash
from gpudash.options import MonitorOptions
from gpudash.trainer import TrainConfig, train

CATS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
SECTION = "## Strategies (issue 8)"
CLAIMS = """Figures practitioners quote, for comparison (not measured here):
full activation recompute costs ~20-33 % more compute per step; write-ups on
fitting 7B fine-tuning onto consumer cards claim block checkpointing saves
~18 % memory at +15 % step time and finer (selective) checkpointing ~32 % at
+29 %."""


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def run_cell(runs: Path, preset: str, ckpt: str, precision: str, offload: str, args: argparse.Namespace,
             overrides: dict[str, Any]) -> dict[str, Any]:
    name = f"{preset}-{ckpt}-{precision}-{offload.replace('+', '_')}"
    run_dir = runs / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = TrainConfig(preset=preset, model_overrides=overrides, steps=args.steps, run_dir=run_dir, name=name,
                      device=args.device, ckpt=ckpt, precision=precision, offload=offload, batch=args.batch,
                      seq_len=args.seq_len, min_len=args.seq_len, seed=0,
                      monitor=MonitorOptions(host_hz=0.0))
    r = gpudash.load_run(train(cfg))
    try:
        steady = r.steps[r.steps["step"] >= args.warmup]
        mem = r.memory
        row: dict[str, Any] = {"cell": name, "ckpt": ckpt, "precision": precision, "offload": offload}
        for c in CATS:
            row[c] = float(mem[c].max()) if c in mem else 0.0
        row["total"] = sum(row[c] for c in CATS)
        row["host"] = float(mem["offload_host_bytes"].max()) if "offload_host_bytes" in mem else 0.0
        row["step_peak"] = float(mem["peak_bytes"].max()) if "peak_bytes" in mem else None
        row["predicted_peak"] = r.meta["estimate"]["peak_bytes"]
        row["predicted_act"] = r.meta["estimate"]["activations_bytes"]
        est = r.meta["estimate"]
        row["predicted_recompute"] = est.get("recompute_flops_per_token", 0) / max(est.get("flops_per_token", 1), 1)
        row["step_s"] = statistics.median(steady["duration_s"])
        # every step does the same work (equal-length samples), so the fastest step is the
        # least disturbed estimate of its cost
        row["cpu_s"] = float(steady["thread_cpu_s"].min())
        row["tok_s"] = float(steady["tokens"].sum() / steady["duration_s"].sum())
        return row
    finally:
        r.close()


def table(rows: list[dict[str, Any]], gpu: bool) -> list[str]:
    base = next(r for r in rows if r["ckpt"] == "none" and r["precision"] == "fp32" and r["offload"] == "none")
    head = ("| ckpt | precision | offload | params MiB | grads MiB | optimizer MiB | activations MiB | "
            "sum MiB | sum vs fp32 | activations vs fp32 | predicted act. MiB | offload host MiB | ")
    head += "step peak MiB | predicted peak MiB | " if gpu else ""
    head += "step ms (wall, median) | wall vs fp32 | step ms (CPU, min) | CPU vs fp32 |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        line = (f"| {r['ckpt']} | {r['precision']} | {r['offload']} | {mib(r['params_bytes'])} | "
                f"{mib(r['grads_bytes'])} | {mib(r['optimizer_bytes'])} | {mib(r['activations_bytes'])} | "
                f"{mib(r['total'])} | {r['total'] / base['total'] - 1:+.0%} | "
                f"{r['activations_bytes'] / base['activations_bytes'] - 1:+.0%} | {mib(r['predicted_act'])} | "
                f"{mib(r['host']) if r['host'] else '-'} | ")
        if gpu:
            line += f"{mib(r['step_peak'] or 0)} | {mib(r['predicted_peak'])} | "
        line += (f"{r['step_s'] * 1e3:.1f} | {r['step_s'] / base['step_s']:.2f}x | {r['cpu_s'] * 1e3:.1f} | "
                 f"{r['cpu_s'] / base['cpu_s']:.2f}x |")
        out.append(line)
    return out


def machine() -> str:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return platform.processor()


def write_results(path: Path, lines: list[str]) -> None:
    """Replace (or append) only this benchmark's section; other sections are other people's."""
    results.write_section(SECTION, "\n".join(lines), path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = torch.cuda.is_available()
    p.add_argument("--preset", default="gpt2-124m" if gpu else "tiny")
    p.add_argument("--seq-len", type=int, default=1024 if gpu else 128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/strategies"))
    p.add_argument("--write", action="store_true", help="update this section of benchmarks/RESULTS.md")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    on_gpu = gpu and args.device != "cpu"
    overrides: dict[str, Any] = {}
    if args.preset == "tiny" and args.seq_len > 64:
        overrides["block_size"] = args.seq_len
    precisions = ["fp32", "bf16", "fp16"] if on_gpu else ["fp32", "bf16"]
    # fp16's loss scaler steps a device optimizer, so fp16 is not combined with offload
    cells = [(c, pr, o) for o in ("none", "optimizer") for pr in precisions
             for c in ("none", "attn", "mlp", "every-2", "block") if not (pr == "fp16" and o != "none")]
    rows = []
    t0 = time.time()
    for ckpt, precision, offload in cells:
        rows.append(run_cell(args.runs_dir, args.preset, ckpt, precision, offload, args, overrides))
        print(f"  {rows[-1]['cell']}: {rows[-1]['step_s'] * 1e3:.1f} ms/step", file=sys.stderr)
    # the plain cell once more at the end: how far the timing drifted while the matrix ran
    again = run_cell(args.runs_dir / "repeat", args.preset, "none", "fp32", "none", args, overrides)
    drift = again["cpu_s"] / rows[0]["cpu_s"] - 1
    lines = table(rows, on_gpu)
    twin = next(r for r in rows if (r["ckpt"], r["precision"], r["offload"]) == ("none", "fp32", "optimizer"))
    lines += ["", f"Noise: the plain fp32 cell run again after the matrix took {again['cpu_s'] * 1e3:.1f} ms CPU "
              f"per step ({drift:+.0%} against the first run); on a CPU the offload twin of that cell does the "
              f"same work plus copies and measured {twin['cpu_s'] / rows[0]['cpu_s'] - 1:+.0%}. Read time "
              f"differences of ~10 % or less as noise."]
    print("\n".join(lines))
    if args.write:
        load = ""
        try:
            import os

            load = f", load average {os.getloadavg()[0]:.1f} while measuring"
        except OSError:
            pass
        cmd = "python " + " ".join(["benchmarks/strategies.py", *sys.argv[1:]])
        device = torch.cuda.get_device_name() if on_gpu else "CPU"
        section = [SECTION, "",
                   f"Measured {time.strftime('%Y-%m-%d')} on {device}{load}, torch {torch.__version__}, "
                   f"{len(cells)} cells in {time.time() - t0:.0f} s: `{cmd}`. Preset {args.preset} "
                   f"(seq {args.seq_len}, batch {args.batch}, {args.steps} steps, median step time after "
                   f"{args.warmup}). Runs in `{args.runs_dir}`.", "",
                   "```", *machine().splitlines()[:10], "```", "", *lines, "", CLAIMS, ""]
        section += summary(rows)
        write_results(Path(__file__).with_name("RESULTS.md"), section)
    return 0


def summary(rows: list[dict[str, Any]]) -> list[str]:
    def cell(ckpt: str) -> dict[str, Any]:
        return next(r for r in rows if r["ckpt"] == ckpt and r["precision"] == "fp32" and r["offload"] == "none")

    base = cell("none")
    out = ["What ours measured (fp32, no offload, against no checkpointing):", ""]
    for ckpt in ("block", "every-2", "attn", "mlp"):
        r = cell(ckpt)
        out.append(f"- {ckpt}: activations {r['activations_bytes'] / base['activations_bytes'] - 1:+.0%}, "
                   f"all categories {r['total'] / base['total'] - 1:+.0%}, step CPU time "
                   f"{r['cpu_s'] / base['cpu_s'] - 1:+.0%} (wall {r['step_s'] / base['step_s'] - 1:+.0%}; "
                   f"the estimator's FLOP count says {r['predicted_recompute']:+.0%})")
    blk = cell("block")
    if blk["cpu_s"] / base["cpu_s"] - 1 < blk["predicted_recompute"]:
        out.append("- block's measured overhead sits below its FLOP count: the count covers matmuls only, while a "
                   "step also spends time in the optimizer, the data phase and Python, which recompute does not "
                   "repeat")
    else:
        out.append("- block's measured overhead exceeds its FLOP count: recompute also repeats the non-matmul "
                   "work (LayerNorm, GELU, attention softmax) and the checkpoint bookkeeping")
    costs = {c: cell(c)["cpu_s"] / base["cpu_s"] - 1 for c in ("block", "every-2", "attn", "mlp")}
    partial = ("every-2", "attn", "mlp")
    lo, hi = min(partial, key=costs.__getitem__), max(partial, key=costs.__getitem__)
    block_mem = 1 - cell("block")["total"] / base["total"]
    out += ["", NOTES.format(lo=lo, lo_cost=costs[lo], hi=hi, hi_cost=costs[hi], block_cost=costs["block"],
                             block_mem=block_mem)]
    return out


NOTES = """How to read this. Memory is exact: the Monitor's categories (saved-tensor
hooks for activations, enumerated tensors for the rest), and the estimator's
activation prediction matches it to the byte on CPU. Time is not: on a shared
2-core box the wall-clock column swings with other processes, so read the
"step ms (CPU)" column (this thread's CPU time per step, one intra-op thread),
which other processes do not inflate; repeat runs move it by several points.
Against the quoted figures: full block recompute cost {block_cost:+.0%} CPU time
per step here (quoted: +20-33 %; +15 % in the 7B write-ups), the partial modes
{lo_cost:+.0%} ({lo}) to {hi_cost:+.0%} ({hi}). Memory moved far more than the
quoted -18 % / -32 %: block checkpointing cut all measured bytes by
{block_mem:.0%}, because the quoted figures are of total GPU memory in a 7B
fine-tune, where weights and optimizer state dominate, while on the tiny preset
activations are ~90 % of all bytes. Offload on a CPU run moves nothing (host
and device are the same memory; the optimizer bytes stay), it only adds the
copies. bf16 autocast is slower on this CPU (no native bf16 matmul) and cuts
activations by ~39 %, not 50 %: the residual stream, LayerNorm statistics and
the fp32 log-softmax stay 32-bit. The GPU table (issue 7) is what settles time
and the allocator peak."""


if __name__ == "__main__":
    sys.exit(main())
