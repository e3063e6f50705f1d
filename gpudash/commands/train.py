"""``gpudash train``: the memory-optimized trainer from the command line.

    gpudash train --preset tiny --steps 50 --ckpt block --precision bf16 --run-dir runs/tiny-block

Testing aids (documented, off by default): ``--memory-budget-gb`` and
``--inject-oom-at-batch`` make OOMs happen on a CPU, ``--inject-nan-at-step``
makes the loss non-finite, ``--slow-data-ms`` makes the run input-bound.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from gpudash.errors import UserError

__all__ = ["add_arguments", "nonnegative_float", "positive_float", "positive_int", "run", "summary_lines"]


def positive_int(text: str) -> int:
    """A flag that counts something (steps, tokens, samples): a whole number >= 1. 0 is refused
    rather than read as "the default", which is what leaving the flag out gives."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n} (leave the flag out for the default)")
    return n


def _float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def positive_float(text: str) -> float:
    """A size or rate (GB, TFLOP/s): a finite number > 0."""
    x = _float(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text} (leave the flag out for the default)")
    return x


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (0: off, as the flag's help says)."""
    x = _float(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return x


def _steps_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step numbers like 5,6,7, got {text!r}") from None
    if any(s < 0 for s in out):
        raise argparse.ArgumentTypeError("step numbers must be >= 0")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpudash.trainer.model import PRESETS

    p.add_argument("--preset", default="tiny", help=f"model shape: {', '.join(PRESETS)} (default: tiny)")
    p.add_argument("--model", action="append", default=[], metavar="FIELD=VALUE",
                   help="change the preset's shape, e.g. --model n_layer=2 (repeatable)")
    p.add_argument("--steps", type=positive_int, default=50, help="optimizer steps (default: 50)")
    p.add_argument("--ckpt", default="none", help="gradient checkpointing: none, block, every-N, attn, mlp")
    p.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16 (default: fp32)")
    p.add_argument("--offload", default="none", help="none, optimizer or optimizer+grads (default: none)")
    p.add_argument("--weights", default="fp32", help="device weight dtype fp32 or bf16 (bf16 needs --offload)")
    p.add_argument("--batch", default="auto", help="micro-batch: auto (estimator, then adaptive) or N")
    p.add_argument("--effective-batch", type=positive_int, default=0,
                   help="samples per optimizer step (default: N for --batch N, 16 for auto)")
    p.add_argument("--max-micro-batch", type=positive_int, default=0, help="cap for the adaptive micro-batch")
    p.add_argument("--seq-len", type=positive_int, default=0, help="longest sample in tokens (default: preset block size)")
    p.add_argument("--min-len", type=positive_int, default=0, help="shortest sample (default: seq-len / 2)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--grad-clip", type=nonnegative_float, default=1.0, help="clip the gradient norm (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive_int, default=0,
                   help="CPU threads (default: 1 below 20 M parameters, else torch's default)")
    p.add_argument("--run-dir", type=Path, default=None, help="run directory (default: runs/train-<time>)")
    p.add_argument("--name", default=None, help="run name shown in the dashboard")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--memory-cap-gb", type=positive_float, default=0.0,
                   help="CUDA: behave like a card of this size (set_per_process_memory_fraction)")
    p.add_argument("--memory-budget-gb", type=positive_float, default=0.0,
                   help="CPU testing aid: OOM when measured bytes exceed this")
    p.add_argument("--inject-oom-at-batch", type=positive_int, default=0, metavar="N",
                   help="testing aid: raise OutOfMemoryError in forward while the micro-batch is >= N")
    p.add_argument("--inject-nan-at-step", type=_steps_list, default=(), metavar="N[,M...]",
                   help="testing aid: make the loss non-finite at these steps")
    p.add_argument("--inject-spike-at-step", type=_steps_list, default=(), metavar="N[,M...]",
                   help="testing aid: multiply the loss by 8 at these steps (a loss spike)")
    p.add_argument("--monitor", action="append", default=[], metavar="KEY=VALUE",
                   help="a Monitor option, e.g. activations_every=1 or snapshot_every=10 (repeatable)")
    p.add_argument("--slow-data-ms", type=nonnegative_float, default=0.0, metavar="MS",
                   help="testing aid: sleep in the data phase of every step (input-bound run)")
    p.add_argument("--fallback-after", type=positive_int, default=3, help="non-finite steps in a row before fp32 fallback")
    p.add_argument("--min-loss-scale", type=nonnegative_float, default=1.0, help="fp16: fall back to fp32 below this loss scale")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    from gpudash.alerts.delivery import add_alert_arguments

    add_alert_arguments(p)


def _monitor_options(items: list[str], args: argparse.Namespace | None = None) -> dict[str, Any]:
    from gpudash.alerts.delivery import alerts_from_args
    from gpudash.options import MonitorOptions
    from gpudash.trainer.shapes import parse_fields

    try:
        out = parse_fields(items, MonitorOptions, "--monitor", what="KEY")
        alerts = alerts_from_args(args) if args is not None else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if alerts is not None:
        out["alerts"] = alerts
    return out


def config_from_args(args: argparse.Namespace) -> Any:
    from gpudash.trainer.config import TrainConfig
    from gpudash.trainer.shapes import parse_overrides

    run_dir = args.run_dir or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    try:
        return TrainConfig(
            preset=args.preset, model_overrides=parse_overrides(args.model), steps=args.steps, run_dir=run_dir, name=args.name, device=args.device,
            ckpt=args.ckpt, precision=args.precision, offload=args.offload, weights=args.weights,
            batch=args.batch, effective_batch=args.effective_batch, max_micro_batch=args.max_micro_batch,
            seq_len=args.seq_len, min_len=args.min_len, lr=args.lr, grad_clip=args.grad_clip, seed=args.seed,
            threads=args.threads,
            memory_cap_gb=args.memory_cap_gb, memory_budget_gb=args.memory_budget_gb,
            inject_oom_at_batch=args.inject_oom_at_batch, inject_nan_at_steps=args.inject_nan_at_step,
            inject_spike_at_steps=args.inject_spike_at_step, monitor_options=_monitor_options(args.monitor, args),
            slow_data_ms=args.slow_data_ms, fallback_after=args.fallback_after,
            min_loss_scale=args.min_loss_scale, progress=not args.no_progress,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None


def summary_lines(run_dir: Path) -> list[str]:
    """What a user wants after a run: the run's facts (as ``gpudash info`` states them), the speed the
    trainer measured, the estimator's prediction per category, and the notable events."""
    from gpudash.analysis.facts import headline_rows, run_facts
    from gpudash.store import load_run
    from gpudash.units import human_bytes

    r = load_run(run_dir)
    try:
        facts = run_facts(r)
        lines = [f"run      {run_dir}  ({r.status})"]
        summ = r.meta.get("train_summary") or {}
        if summ.get("seconds"):
            lines.append(f"trainer  final micro-batch {summ.get('final_micro_batch')}, precision "
                         f"{summ.get('final_precision')}")
        lines += [f"  {label:<13} {text}" for label, text in headline_rows(facts, r.meta)
                  if label not in ("status", "device", "ranks")]
        if len(r.steps) and "loss" in r.steps and r.steps["loss"].notna().any():
            loss = r.steps["loss"].dropna()
            lines.append(f"  {'loss':<13} {loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f}")
        est = r.meta.get("estimate") or {}
        pred = [f"{k} {human_bytes(est[f'{k}_bytes'])}" for k in facts.peak_bytes
                if k != "measured" and est.get(f"{k}_bytes") is not None]
        if est.get("peak_bytes"):
            pred.append(f"peak {human_bytes(est['peak_bytes'])}")
        if pred:
            lines.append(f"  {'predicted':<13} " + ", ".join(pred))
        if len(r.events):
            for _, ev in r.events.iterrows():
                if ev["kind"] in ("oom", "precision_fallback", "batch_size_change", "loss_spike", "nan",
                                  "config_warning"):
                    step = "" if ev["step"] != ev["step"] else f"step {int(ev['step']):>4}  "
                    lines.append(f"  {step}{ev['kind']}: {ev['message']}")
        lines.append(f"look at it: gpudash serve {run_dir.parent}   |   gpudash info {run_dir}")
        return lines
    finally:
        r.close()


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    from gpudash.trainer.estimator import fmt_gb
    from gpudash.trainer.loop import Trainer

    try:
        trainer = Trainer(cfg)
        trainer.build()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if trainer.rank == 0:
        est = trainer.estimate
        print(f"gpudash train: {cfg.preset} ({trainer.model_cfg.n_params() / 1e6:,.1f} M parameters) on "
              f"{trainer.device}, ckpt {cfg.ckpt}, {cfg.precision}, offload {cfg.offload}, micro-batch "
              f"{trainer.batch.micro} of {cfg.effective}; predicted peak {fmt_gb(est.peak_bytes)} -> {cfg.run_dir}",
              flush=True)
    try:
        run_dir = trainer.run()
    except MemoryError as exc:  # out of memory even at micro-batch 1: the config cannot run here
        raise UserError(str(exc)) from None
    if trainer.rank == 0:
        print("\n".join(summary_lines(run_dir)))
    return 0
