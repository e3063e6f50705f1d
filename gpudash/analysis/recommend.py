"""Recommendations grounded in the run's own numbers.

:func:`recommend` fills ``recommendation`` and ``saving`` of each verdict and
puts the predicted effect in ``numbers`` (``saving_fraction``: share of the
run's time a fix would save, negative when it costs time; ``saving_bytes``).

Memory predictions come from the memory model (:mod:`gpudash.memmodel`, plain
arithmetic, no torch) when the run recorded the model shape; otherwise from the
measured categories and a stated rule of thumb.
"""

from __future__ import annotations

from typing import Any

from gpudash.analysis.verdict import Verdict, fmt_pct, fmt_s, num
from gpudash.memmodel import fit
from gpudash.memmodel.estimator import ModelShape
from gpudash.memmodel.hf_arch import HFArch
from gpudash.memmodel.plan import FitOption, usable_bytes
from gpudash.store.run import Run
from gpudash.store.schema import MEMORY_PARTS
from gpudash.units import human_bytes

__all__ = ["CKPT_TIME_COST", "adapter_mixes", "predict", "recommend", "run_setup"]

CKPT_TIME_COST = 0.25
"""Full activation recompute costs ~20–33 % more compute per step (ANCHORS.md); we quote the middle."""
OFFLOAD_TIME_COST = 0.2
"""torchao CPUOffloadOptimizer: 1.27 → 1.52 s/it (+20 %) on a 1.1 B ViT."""
_SHAPE_KEYS = ("vocab_size", "n_layer", "n_head", "n_embd")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(_flat(v, f"{prefix}{k}."))
            out.setdefault(str(k), v)
    return out


def run_setup(run: Run) -> dict[str, Any]:
    """The run's technique mix and shape, from whatever config the trainer recorded."""
    cfg = _flat(run.meta.get("config") or {})
    trainer = run.meta.get("trainer")
    if isinstance(trainer, dict):  # gpudash's trainer: model shape, parameter count, sequence length
        cfg.update(_flat(trainer.get("model") or {}))
        for src, dst in (("params", "n_params"), ("seq_len", "seq_len")):
            if isinstance(trainer.get(src), int):
                cfg[dst] = trainer[src]
    cfg.update({k: v for k, v in _flat(run.meta).items() if k in ("ckpt", "precision", "offload") and k not in cfg})
    steps = run.steps
    for col in ("micro_batch", "batch_size"):
        if col in steps and steps[col].notna().any():
            cfg.setdefault("micro_batch", int(steps[col].dropna().iloc[-1]))
    if "micro_batch" not in cfg:
        for k in ("batch", "batch_size", "micro_batch_size"):
            if isinstance(cfg.get(k), int):
                cfg["micro_batch"] = cfg[k]
                break
    return cfg


def predict(run: Run, batch: int | None = None, **change: str) -> dict[str, float] | None:
    """The estimator's prediction for this run's shape (at micro-batch ``batch``,
    default the run's last) with ``change`` applied (e.g. ``ckpt="block"``), as a
    dict of byte counts; None when it cannot say."""
    cfg = run_setup(run)
    if batch is not None:
        cfg["micro_batch"] = batch
    if not all(isinstance(cfg.get(k), int) for k in _SHAPE_KEYS):
        return None
    seq = cfg.get("seq_len") or cfg.get("block_size")
    batch = cfg.get("micro_batch")
    if not isinstance(seq, int) or not isinstance(batch, int):
        return None
    hidden = cfg.get("mlp_hidden") or cfg.get("hidden") or 4 * cfg["n_embd"]
    n_params = cfg.get("n_params") or cfg.get("num_params")
    if not isinstance(n_params, int):
        return None
    try:
        shape = ModelShape(cfg["vocab_size"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"], int(hidden),
                               cfg.get("mlp") == "swiglu", n_params)
        kw: dict[str, Any] = {k: str(cfg[k]) for k in ("ckpt", "precision", "offload") if isinstance(cfg.get(k), str)}
        kw.update(change)
        e = fit.estimate(shape, micro_batch=batch, seq_len=seq, **kw)
    except Exception:  # noqa: BLE001 - a config the estimator does not know: fall back to rules of thumb
        return None
    return {k: float(v) for k, v in e.to_dict().items() if k.endswith("_bytes")}


def _hf_arch(run: Run) -> HFArch | None:
    """The run's architecture for the fine-tuning estimator: a recorded Hugging Face config (any
    dict with a ``model_type`` in the run's meta), else gpudash's GPT shape as the nearest family."""
    stack: list[Any] = [run.meta]
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            if isinstance(d.get("model_type"), str):
                try:
                    return HFArch.from_dict(d)
                except (ValueError, TypeError):
                    return None
            stack.extend(v for v in d.values() if isinstance(v, dict))
    cfg = run_setup(run)
    if not all(isinstance(cfg.get(k), int) for k in _SHAPE_KEYS):
        return None
    h, nh = cfg["n_embd"], cfg["n_head"]
    gated = cfg.get("mlp") == "swiglu"
    hidden = int(cfg.get("mlp_hidden") or cfg.get("hidden") or 4 * h)
    try:
        return HFArch("llama" if gated else "gpt2", cfg["vocab_size"], h, cfg["n_layer"], nh, nh, h // nh, hidden,
                         "swiglu" if gated else "gelu_new", "rms" if gated else "layer",
                         bool(cfg.get("tie_embeddings")))
    except ValueError:
        return None


def adapter_mixes(run: Run, capacity: float) -> list[FitOption]:
    """LoRA / QLoRA mixes that fit a card of ``capacity`` bytes (its :data:`CARD_SHARE`, as ``gpudash estimate``) for
    this run's model, sequence length and micro-batch as the step to make up (the memory model's
    :func:`~gpudash.memmodel.fit.what_fits`), fastest first; [] when it cannot say."""
    cfg = run_setup(run)
    if str(cfg.get("finetune") or "full") != "full":
        return []
    seq = cfg.get("seq_len") or cfg.get("block_size") or cfg.get("max_seq_length")
    arch = _hf_arch(run)
    if arch is None or not isinstance(seq, int) or seq < 1:
        return []
    rows = cfg.get("micro_batch")  # the step the run took: an adapter mix makes it up with accumulation
    tokens = rows * seq if isinstance(rows, int) and rows > 0 else 0
    fits = fit.what_fits(arch, card_bytes=capacity, seq_len=seq, tokens_per_step=tokens)
    return [f for f in fits if f.micro_batch and f.finetune != "full"]


def _ckpt_mode(run: Run) -> str:
    return str(run_setup(run).get("ckpt") or "none")


def _precision(run: Run) -> str:
    return str(run_setup(run).get("precision") or "fp32")


def _oom_fit(run: Run, v: Verdict) -> None:
    n = v.numbers
    act, opt = n.get("activations_bytes", 0.0), n.get("optimizer_bytes", 0.0)
    cap, need = n.get("capacity_bytes"), n.get("need_bytes") or sum(
        n.get(k, 0.0) for k in MEMORY_PARTS)
    parts: list[str] = []
    saving: list[str] = []
    mb = n.get("micro_batch")
    batch = int(mb) if mb else run_setup(run).get("micro_batch")
    b = batch if isinstance(batch, int) else None
    now, blk = predict(run, b), predict(run, b, ckpt="block")
    if act:
        act = min(act, need)  # measured over a whole step, it can exceed what is live at once
    if now and blk:
        act = now["activations_bytes"]
    if act >= opt and _ckpt_mode(run) != "block":
        if now and blk:
            new_act = blk["activations_bytes"]
            new_peak = need * blk["peak_bytes"] / max(now["peak_bytes"], 1.0)
            src = "estimator, per micro-batch; peak = measured × predicted ratio"
        else:
            new_act, src = act * 0.15, "rule of thumb: a checkpointed block keeps only its input"
            new_peak = need - act + new_act
        parts.append("block checkpointing (--ckpt block)")
        saving.append(f"activations {human_bytes(act)} → {human_bytes(new_act)}, predicted peak {human_bytes(need)} → "
                      f"{human_bytes(new_peak)} ({src}), ~+{fmt_pct(CKPT_TIME_COST)} step time")
        v.numbers["saving_bytes"] = need - new_peak
        v.numbers["saving_fraction"] = -CKPT_TIME_COST
    elif opt > 0:
        parts.append("offload optimizer state to pinned host memory (--offload optimizer)")
        saving.append(f"optimizer state {human_bytes(opt)} leaves the device, predicted peak {human_bytes(need)} → "
                      f"{human_bytes(need - opt)}, ~+{fmt_pct(OFFLOAD_TIME_COST)} step time (torchao measured)")
        v.numbers["saving_bytes"] = opt
        v.numbers["saving_fraction"] = -OFFLOAD_TIME_COST
    if _precision(run) == "fp32" and act > 0:
        bf = predict(run, b, precision="bf16")
        if bf and now:
            # only worth saying when the estimator sees a real saving (fp32 logits and the
            # residual stream stay 32-bit, so a small model may gain almost nothing)
            if bf["activations_bytes"] < 0.95 * now["activations_bytes"]:
                parts.append("bf16 autocast (--precision bf16)")
                saving.append(f"bf16 activations: {human_bytes(now['activations_bytes'])} → "
                              f"{human_bytes(bf['activations_bytes'])} (estimator)")
        else:
            parts.append("bf16 autocast (--precision bf16)")
            saving.append(f"16-bit activations: about {human_bytes(act / 2)} less (rule of thumb: half)")
    if cap:
        mixes = adapter_mixes(run, cap)
        shown: list[str] = []
        for f in mixes:
            label = f"{'QLoRA (nf4 base)' if f.finetune == 'qlora' else 'LoRA (bf16 base)'}"
            if f.ckpt == "block":
                label += " + checkpointing"
            if f.optimizer != "adamw":
                label += f" + {f.optimizer}"
            text = f"{label}: micro-batch {f.micro_batch}, predicted peak {human_bytes(f.peak_bytes)}"
            if label not in " ".join(shown):
                shown.append(text)
            if len(shown) == 3:
                break
        if shown:
            parts.append("or fine-tune adapters instead of every weight (peft LoRA or QLoRA; details: gpudash estimate "
                         "--finetune lora|qlora): " + "; ".join(shown))
            v.numbers["adapter_peak_bytes"] = float(mixes[0].peak_bytes)
    if cap and need and act and isinstance(batch, int) and batch > 1:
        fixed = need - act
        usable = usable_bytes(cap)  # what gpudash estimate calls fitting
        fits = int(batch * (usable - fixed) / act) if usable > fixed else 0
        if 0 < fits < batch:
            parts.append(f"or a micro-batch of {fits} (from {batch}) with gradient accumulation")
    v.recommendation = "; ".join(parts) if parts else "reduce the micro-batch or sequence length"
    v.saving = "; ".join(saving) or None


def _oom_frag(run: Run, v: Verdict) -> None:
    ru = v.numbers.get("reserved_unallocated_bytes")
    v.recommendation = ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) so freed "
                        "blocks can be reused for larger requests")
    if ru:
        v.saving = f"up to {human_bytes(ru)} reserved-but-unallocated memory becomes usable"
        v.numbers["saving_bytes"] = ru


def _oom_other(run: Run, v: Verdict) -> None:
    out = v.numbers.get("outside_bytes")
    v.recommendation = ("another process holds device memory: stop it (nvidia-smi lists it) or give this job a "
                        "GPU of its own; cap the other job with set_per_process_memory_fraction")
    if out:
        v.saving = f"{human_bytes(out)} of device memory back for this run"
        v.numbers["saving_bytes"] = out


def _time_fix(v: Verdict, text: str, group_share: float) -> None:
    v.recommendation = text
    med = v.numbers.get("median_step_s")
    share_run = v.numbers.get("share_of_run", 1.0)
    frac = group_share * share_run
    v.numbers["saving_fraction"] = frac
    if med:
        v.saving = (f"up to {fmt_pct(group_share)} of each step: median step {fmt_s(med)} → "
                    f"{fmt_s(med * (1 - group_share))} if it overlaps with compute "
                    f"(≈ {fmt_s(v.numbers.get('lost_s', 0.0))} of this run)")


def recommend(run: Run, verdicts: list[Verdict]) -> list[Verdict]:
    """Fill in the recommendation and predicted saving of each verdict (in place; returns the list)."""
    for v in verdicts:
        kind = v.kind
        share = v.numbers.get("share_of_step", 0.0)
        if kind in ("oom:did not fit", "oom:unexplained", "oom:undetermined"):
            _oom_fit(run, v)
        elif kind == "oom:fragmentation":
            _oom_frag(run, v)
        elif kind == "oom:another process":
            _oom_other(run, v)
        elif kind == "input-bound":
            _time_fix(v, "the loop waits for data: more DataLoader workers (num_workers), pin_memory=True, "
                         "prefetch_factor, or pre-tokenize/cache the dataset", share)
        elif kind == "host-offload-bound":
            _time_fix(v, "host copies dominate: overlap them on a side stream with pinned buffers, offload only "
                         "the optimizer state, or raise the micro-batch so each copy is amortized", share)
        elif kind == "synchronization-bound":
            _time_fix(v, "time goes outside the recorded phases: look for blocking calls each step (.item(), "
                         ".cpu(), printing tensors), log every N steps, and compare ranks for a straggler", share)
        elif kind == "non-finite":
            v.recommendation = ("lower the learning rate or add warm-up, clip gradients, and prefer bf16 autocast "
                                "over fp16 (no loss scaling to overflow)")
        elif kind == "loss-spike":
            v.recommendation = ("clip gradients (e.g. max-norm 1.0), lower the peak learning rate, and check the "
                                "batches at those steps for bad data")
        elif kind == "loss-scale-collapse":
            v.recommendation = ("the fp16 loss scale kept backing off: switch to bf16 autocast, or find the op that "
                                "overflows (anomaly detection on a short run)")
        elif kind == "precision-fallback":
            v.recommendation = ("the run finished in fp32 after falling back: use bf16 autocast from the start, or "
                                "fix the cause of the non-finite steps before re-enabling fp16")
            v.saving = "16-bit activations again (about half the activation memory) once the cause is fixed"
        elif kind == "batch-oscillation":
            lo = num(v.numbers.get("settled_batch"))
            v.recommendation = (f"pin the micro-batch at {int(lo)} (where it settled after each OOM) with gradient "
                                "accumulation, or lower the headroom target of the adaptive batch size"
                                if lo else "pin the micro-batch size")
            v.saving = "no more OOM retries and re-tuning steps"
    return verdicts
