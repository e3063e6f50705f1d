"""``gpudash estimate``: predicted memory by category, and what fits a card.

    gpudash estimate --preset gpt2-124m --batch 8 --seq-len 1024 --ckpt block --precision bf16
    gpudash estimate --preset llama-7b --seq-len 2048 --card-gb 24
    gpudash estimate --config config.json --finetune lora --lora-r 8 --batch 4 --seq-len 512
    gpudash estimate --preset llama-2-7b --finetune qlora --ckpt block --precision bf16 --card-gb 12

``--config`` (or a preset shipped as a config.json: llama-2-7b ...) names a Hugging Face model, the
other presets gpudash's own GPT; either goes the same way through :mod:`gpudash.memmodel.fit`, and the
memory model's errors name its parameters, which this command names by its flags (:data:`FLAGS`).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from dataclasses import asdict
from typing import Any

from gpudash.commands._flags import positive_float, positive_int
from gpudash.errors import UserError
from gpudash.memmodel.fit import estimate, explain, reference, what_fits
from gpudash.memmodel.hf_arch import CONFIG_DIR, HFArch, hf_preset, load_config
from gpudash.memmodel.names import ATTNS, FINETUNES, OFFLOADS, OPTIMIZERS, PRECISIONS
from gpudash.memmodel.plan import CARD_SHARE, Estimate, FitOption, ParamError, fits, usable_bytes
from gpudash.memmodel.shapes import PRESETS, parse_overrides, preset
from gpudash.memmodel.steptime import StepTimeModel
from gpudash.store.schema import MEMORY_CATEGORIES
from gpudash.units import GiB, fmt_duration, given, human_bytes

__all__ = ["add_arguments", "run"]

_TIME = StepTimeModel()
#: The estimate's numbers a run prints, one line each: the memory categories, then the peak and the host RAM.
_PRINTED = (*MEMORY_CATEGORIES, "peak_bytes", "host_bytes")
#: The memory model's parameters as this command's flags, for its error messages.
FLAGS = {"micro_batch": "--batch", "seq_len": "--seq-len", "accum": "--accum", "ckpt": "--ckpt",
         "precision": "--precision", "offload": "--offload", "weights": "--weights", "finetune": "--finetune",
         "optimizer": "--optimizer", "attn": "--attn", "lora_r": "--lora-r", "lora_targets": "--lora-targets",
         "lora_dropout": "--lora-dropout", "path": "--config", "tflops": "--tflops", "pcie_gbps": "--pcie-gbps"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    hf = sorted(f.stem for f in CONFIG_DIR.glob("*.json"))
    p.add_argument("--preset", default="tiny",
                   help=f"model shape: {', '.join(PRESETS)}, or a shipped HF config: {', '.join(hf)} (default: tiny)")
    p.add_argument("--config", default="", metavar="PATH",
                   help="a Hugging Face config.json (or a model folder holding one): llama, mistral, qwen2, gemma, "
                        "phi, gpt2")
    p.add_argument("--finetune", default="full", help=f"{', '.join(FINETUNES)} (HF models; default full)")
    p.add_argument("--lora-r", type=positive_int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--lora-targets", default="", help="modules, e.g. q_proj,v_proj (default: PEFT's for the model)")
    p.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout (default 0, PEFT's)")
    p.add_argument("--optimizer", default="adamw", help=f"{', '.join(OPTIMIZERS)} (HF models; default adamw)")
    p.add_argument("--attn", default="sdpa", help=f"{', '.join(ATTNS)} (HF models; default sdpa)")
    p.add_argument("--no-double-quant", action="store_true", help="nf4 without double quantization")
    p.add_argument("--model", action="append", default=[], metavar="FIELD=VALUE",
                   help="change the preset's shape, e.g. --model n_layer=48 --model n_embd=2048 (repeatable)")
    p.add_argument("--batch", type=positive_int, default=8, help="micro-batch (default: 8)")
    p.add_argument("--seq-len", type=positive_int, default=0,
                   help="sequence length (default: the preset's block size; 512 for a Hugging Face config)")
    p.add_argument("--accum", type=positive_int, default=1, help="gradient-accumulation micro-steps (default: 1)")
    p.add_argument("--ckpt", default="none", help="none, block, every-N, attn, mlp")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="(default: fp32)")
    p.add_argument("--offload", default="none", choices=OFFLOADS, help="state in host memory (default: none)")
    p.add_argument("--weights", default="",
                   help="weight dtype: fp32 or bf16 (GPT: bf16 needs --offload); HF models also fp16, int8, nf4 "
                        "(default fp32; lora in 16-bit bf16; qlora nf4)")
    p.add_argument("--card-gb", type=positive_float, default=0.0,
                   help="also list which technique mixes fit this card")
    p.add_argument("--tflops", type=positive_float, default=_TIME.tflops,
                   help="with --card-gb: achieved 16-bit training TFLOP/s for the step-time column "
                        f"(default: {_TIME.tflops:g})")
    p.add_argument("--pcie-gbps", type=positive_float, default=_TIME.pcie_gbps,
                   help=f"with --card-gb: host<->device GB/s for offload (default: {_TIME.pcie_gbps:g})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _host_ram() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no reading: the comparison is left out, not the answer
        return None


def _wrap(text: str, label: str = "note") -> str:
    return textwrap.fill(text, width=110, initial_indent=f"  {label}: ", subsequent_indent="    ")


def _shipped() -> str:
    return ", ".join(sorted(f.stem for f in CONFIG_DIR.glob("*.json")))


def _model(args: argparse.Namespace) -> tuple[Any, str, int]:
    """The model the flags name, its name and the default sequence length."""
    if args.config:
        arch = load_config(args.config)
        return arch, arch.name or arch.family, 512
    if args.preset in PRESETS:
        if args.finetune != "full":
            raise UserError(f"--finetune {args.finetune} needs a Hugging Face model: add --config config.json or "
                            f"--preset llama-2-7b (shipped: {_shipped()})")
        shape = preset(args.preset, **parse_overrides(args.model))
        return shape, args.preset, shape.block_size
    shipped = hf_preset(args.preset)
    if shipped is None:
        raise UserError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)} or a shipped "
                        f"Hugging Face config ({_shipped()}), or pass --config config.json")
    return shipped, shipped.name or args.preset, 512


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ParamError as exc:
        raise UserError(exc.render(FLAGS)) from None
    except ValueError as exc:  # a config.json or --model value the model refuses: the message names it
        raise UserError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    model, name, default_seq = _model(args)
    hf = isinstance(model, HFArch)
    if hf and args.model:
        raise UserError("--model changes gpudash's own GPT presets; for a Hugging Face model edit a copy of its "
                        "config.json and pass it with --config")
    seq = args.seq_len or default_seq
    if hf and model.positions and seq > model.positions:
        raise UserError(f"--seq-len {seq} is longer than the model's {model.positions} learned positions "
                        f"(n_positions in config.json)")
    if not hf and seq > model.block_size:
        raise UserError(f"--seq-len {seq} is longer than the {name} block size {model.block_size}; "
                        f"add --model block_size={seq} to estimate the longer context")
    targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()) or None
    adapter: dict[str, Any] = {"lora_r": args.lora_r, "lora_targets": targets, "lora_dropout": args.lora_dropout,
                               "double_quant": not args.no_double_quant}
    mix: dict[str, Any] = {"finetune": args.finetune, "weights": args.weights or ("" if hf else "fp32"),
                           "optimizer": args.optimizer, "attn": args.attn, "ckpt": args.ckpt,
                           "precision": args.precision, "offload": args.offload, **adapter}
    est = estimate(model, micro_batch=args.batch, seq_len=seq, accum=args.accum, **mix)
    time_model = StepTimeModel(tflops=args.tflops, pcie_gbps=args.pcie_gbps)
    notes = explain(model, est)
    host_ram = _host_ram()
    tokens = args.batch * args.accum * seq
    out: dict[str, Any] = {("config" if args.config else "preset"): args.config or args.preset,
                           "family": model.family if hf else "gpudash-gpt", **est.to_dict(),
                           "params": est.n_params, "notes": notes, "host_ram_bytes": host_ram}
    options: list[FitOption] = []
    if args.card_gb:
        options = what_fits(model, card_bytes=args.card_gb * GiB, seq_len=seq, tokens_per_step=tokens,
                         time_model=time_model, **({**adapter, "attn": args.attn if args.attn != "eager" else "sdpa"}
                                                   if hf else {}))
        out["card_gb"] = args.card_gb
        out["fits_card"] = fits(est, args.card_gb * GiB)  # the rule the table's rows were chosen by
        out["usable_bytes"] = usable_bytes(args.card_gb * GiB)
        out["time_model"] = {"tflops": time_model.tflops, "pcie_gbps": time_model.pcie_gbps,
                             "tokens_per_step": tokens, "assumptions": _assumptions(time_model, hf),
                             "step_cost_vs": reference(model)}
        out["what_fits"] = [{**asdict(f), "fits_host_ram": None if host_ram is None else f.host_bytes <= host_ram}
                            for f in options]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    lora = f" r={est.lora_r} on {','.join(est.lora_targets)}" if est.lora_r else ""
    print(f"{name}{f' ({model.family})' if hf else ''}: {est.n_params / 1e6:,.1f} M parameters"
          + (f", {est.trainable_params / 1e6:,.2f} M trainable; {est.finetune}{lora}" if hf else "")
          + f", micro-batch {args.batch} x {seq} tokens, ckpt {est.ckpt}, {est.precision}, offload {est.offload}, "
            f"weights {est.weights}" + (f", {est.optimizer}, attn {est.attn}" if hf else ""))
    for key in _PRINTED:
        extra = ""
        if key == "host_bytes" and est.host_bytes and host_ram:
            extra = f"  (this machine has {human_bytes(host_ram, 2)}{'' if est.host_bytes <= host_ram else ': too little'})"
        print(f"  {key:<18} {human_bytes(getattr(est, key), 2):>12}{extra}")
        if key == "activations_bytes" and est.weight_copies_bytes:
            print(f"    of which autocast's 16-bit weight copies {human_bytes(est.weight_copies_bytes, 2)}")
    if est.recompute_flops_per_token:
        print(f"  recompute          {est.recompute_flops_per_token / est.flops_per_token:+.0%} training FLOPs "
              f"per token ({est.flops_per_token / 1e6:,.1f} MFLOP without checkpointing)")
    for note in notes:
        print(_wrap(note))
    if args.card_gb:
        _print_fits(args, model, est, options, seq, tokens, host_ram, time_model, "fits" if out["fits_card"] else "does NOT fit")
    return 0


def _print_fits(args: argparse.Namespace, model: Any, est: Estimate, options: list[FitOption], seq: int,
                tokens: int, host_ram: int | None, time_model: StepTimeModel, verdict: str) -> None:
    hf = isinstance(model, HFArch)
    mixes = "full, LoRA and QLoRA fine-tunes in bf16 compute" if hf else "technique mixes"
    card = given(args.card_gb, "GB")
    usable = human_bytes(usable_bytes(args.card_gb * GiB), 2)
    print(f"\non a {card} card a plan may fill {CARD_SHARE:.0%} of it ({usable}): this configuration (peak "
          f"{human_bytes(est.peak_bytes, 2)} at --accum {args.accum}) {verdict}. {mixes[0].upper() + mixes[1:]}, fastest first "
          f"(largest micro-batch at seq {seq} whose peak, at the accumulation it needs for a step of {tokens:,} "
          f"tokens (--batch x --accum x --seq-len), is within those {usable}; predicted time of that step):")
    shown = [f for f in options if f.micro_batch][:12 if hf else 10]
    short = False
    for f in shown:
        mark = " "
        if host_ram is not None and f.host_bytes > host_ram:
            mark, short = "!", True
        host = f"host {human_bytes(f.host_bytes, 2)}{mark}" if f.host_bytes else "host -" + " " * len(mark)
        cost = f"({f.step_cost:+.0%})"
        print(f"  micro-batch {f.micro_batch:>4} x{f.accum:<3} peak {human_bytes(f.peak_bytes, 2):>10}  {host:<16} "
              f"step {fmt_duration(f.step_s):>9} {cost:<7} {f.finetune:<5} ckpt {f.ckpt:<8} {f.precision:<5} "
              f"offload {f.offload:<16} weights {f.weights:<4} {f.optimizer}")
    if not shown:
        print("  nothing fits, even at micro-batch 1 with every technique on: use a bigger card, "
              "a shorter --seq-len, or shard the model across GPUs")
        return
    if any(f.host_bytes for f in shown):
        print("  host: the host RAM the offloaded state needs (pinned)"
              + (f"; ! more than this machine's {human_bytes(host_ram, 2)}" if short and host_ram else ""))
    print(_wrap(f"(+N%) is the step time against {reference(model)}; assumes {_assumptions(time_model, hf)}",
                "step time"))
    if not hf:
        print(_wrap("these are full fine-tunes of gpudash's GPT; for LoRA and QLoRA of a Hugging Face model add "
                    "--config config.json (or --preset llama-2-7b) --finetune lora|qlora", "adapters"))


def _assumptions(time_model: StepTimeModel, hf: bool) -> str:
    if not hf:
        return time_model.describe()
    return (f"{time_model.describe()}; a LoRA backward makes no weight gradients for frozen matrices (4 N + 6 N_lora "
            f"FLOPs per token instead of 6 N); QLoRA dequantizes every 4-bit weight in each forward, backward and "
            f"recompute at {given(time_model.hbm_gbps, 'GB/s')}")
