"""``gpudash estimate``: predicted memory by category, and what fits a card.

    gpudash estimate --preset gpt2-124m --batch 8 --seq-len 1024 --ckpt block --precision bf16
    gpudash estimate --preset llama-7b --seq-len 2048 --card-gb 24
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpudash.errors import UserError
from gpudash.trainer.estimator import estimate, fmt_gb, what_fits
from gpudash.trainer.shapes import PRESETS, parse_overrides, preset

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help=f"model shape: {', '.join(PRESETS)} (default: tiny)")
    p.add_argument("--model", action="append", default=[], metavar="FIELD=VALUE",
                   help="change the preset's shape, e.g. --model n_layer=48 --model n_embd=2048 (repeatable)")
    p.add_argument("--batch", type=int, default=8, help="micro-batch (default: 8)")
    p.add_argument("--seq-len", type=int, default=0, help="sequence length (default: the preset's block size)")
    p.add_argument("--accum", type=int, default=1, help="gradient-accumulation micro-steps (default: 1)")
    p.add_argument("--ckpt", default="none", help="none, block, every-N, attn, mlp")
    p.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16")
    p.add_argument("--offload", default="none", help="none, optimizer or optimizer+grads")
    p.add_argument("--weights", default="fp32", help="device weight dtype fp32 or bf16 (bf16 needs --offload)")
    p.add_argument("--card-gb", type=float, default=0.0, help="also list which technique mixes fit this card")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    if args.preset not in PRESETS:
        raise UserError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    try:
        shape = preset(args.preset, **parse_overrides(args.model))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    seq = args.seq_len or shape.block_size
    if args.card_gb < 0:
        raise UserError("--card-gb must be > 0")
    try:
        est = estimate(shape, micro_batch=args.batch, seq_len=seq, ckpt=args.ckpt, precision=args.precision,
                       offload=args.offload, weights=args.weights, accum=args.accum)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out: dict[str, Any] = {"preset": args.preset, "params": shape.n_params(), **est.to_dict()}
    fits = what_fits(shape, card_bytes=args.card_gb * 2**30, seq_len=seq) if args.card_gb else []
    if args.card_gb:
        out["card_gb"] = args.card_gb
        out["fits_card"] = est.peak_bytes <= args.card_gb * 2**30
        out["what_fits"] = [{"ckpt": f.ckpt, "precision": f.precision, "offload": f.offload, "weights": f.weights,
                             "micro_batch": f.micro_batch, "peak_bytes": f.peak_bytes, "cost": f.cost}
                            for f in fits]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.preset}: {shape.n_params() / 1e6:,.1f} M parameters, micro-batch {args.batch} x {seq} tokens, "
          f"ckpt {args.ckpt}, {args.precision}, offload {args.offload}, weights {args.weights}")
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes", "host_bytes"):
        print(f"  {key:<18} {fmt_gb(getattr(est, key)):>12}")
    if est.recompute_flops_per_token:
        print(f"  recompute          {est.recompute_flops_per_token / est.flops_per_token:+.0%} training FLOPs "
              f"per token ({est.flops_per_token / 1e6:,.1f} MFLOP without checkpointing)")
    if args.card_gb:
        verdict = "fits" if out["fits_card"] else "does NOT fit"
        print(f"\non a {args.card_gb:g} GB card this configuration {verdict}. Technique mixes, cheapest first "
              f"(largest micro-batch at seq {seq} within {args.card_gb:g} GB):")
        shown = 0
        for f in fits:
            if f.micro_batch == 0:
                continue
            print(f"  micro-batch {f.micro_batch:>4}  peak {fmt_gb(f.peak_bytes):>10}  ckpt {f.ckpt:<8} "
                  f"{f.precision:<5} offload {f.offload:<16} weights {f.weights}")
            shown += 1
            if shown == 10:
                break
        if not shown:
            print("  nothing fits, even at micro-batch 1 with every technique on: use a bigger card, "
                  "a shorter --seq-len, or shard the model across GPUs")
    return 0
