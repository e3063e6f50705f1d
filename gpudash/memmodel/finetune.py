"""Memory and step time of fine-tuning a Hugging Face model: full, LoRA or QLoRA. Pure arithmetic, no torch.

Bytes by category for one rank (``gpudash estimate --config config.json``):

    params      every parameter in its dtype; under ``--weights nf4`` the decoder's linear weights
                are bitsandbytes 4-bit: n/2 packed bytes, one absmax per 64 values (fp32, or with
                double quantization one uint8 per 64 values plus one fp32 per 256 of those, the
                QLoRA paper's 0.127 bit/param), a 16-entry fp32 code and an fp32 offset per tensor;
                ``int8`` is n bytes plus an fp32 scale per output row (LLM.int8). What is not
                quantized (embeddings, head, norms) is fp32, as peft's prepare_model_for_kbit_training
                casts it. LoRA adapters are fp32 (peft's autocast_adapter_dtype).
    grads       trainable parameters only (a frozen weight gets none)
    optimizer   per trainable tensor: adamw two moments in the parameter's dtype plus a 4-byte step;
                adamw8bit / paged_adamw8bit (bitsandbytes) two uint8 moments plus an fp32 absmax per
                256 values for tensors of >= 4096 values, 32-bit moments below; adafactor (HF, no first
                moment) a row and a column vector per matrix, a full vector per 1-D tensor; sgd none
    activations what autograd saves (:mod:`gpudash.memmodel.hf_activations`)

The peak is params + optimizer + max(gradients at the end of backward, saved activations +
the logits' gradients + the layer being recomputed under checkpointing + a dequantized
weight under 4/8-bit). paged_adamw8bit counts on the device: paging only moves the state
to the host when the device runs out.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from gpudash.memmodel.hf_activations import Setting, layer_flops, saved_bytes
from gpudash.memmodel.hf_arch import HFArch
from gpudash.memmodel.names import (
    ATTNS,
    FINETUNES,
    HF_OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    WEIGHTS,
    Attn,
    Finetune,
    HfOffload,
    Optimizer,
    Precision,
    Weights,
    check,
)
from gpudash.memmodel.plan import Estimate, FitOption, ParamError, largest_fit, plan_accum

__all__ = ["ATTNS", "FINETUNES", "OPTIMIZERS", "WEIGHTS", "estimate_hf", "hf_fits", "hf_notes"]

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _quant_bytes(n: int, rows: int, weights: str, double_quant: bool) -> int:
    if weights == "int8":
        return n + 4 * rows
    blocks = math.ceil(n / 64)
    if double_quant:
        return n // 2 + blocks + 4 * math.ceil(blocks / 256) + 64 + 4
    return n // 2 + 4 * blocks + 64


def _optimizer_bytes(tensors: list[tuple[int, int, int]], optimizer: str) -> int:
    """tensors: (rows, cols, bytes per element) of every trainable tensor (cols 0 for 1-D)."""
    total = 0
    for rows, cols, b in tensors:
        n = rows * (cols or 1)
        if optimizer == "adamw":
            total += 2 * n * b + 4
        elif optimizer in ("adamw8bit", "paged_adamw8bit"):
            total += 2 * n + 8 * math.ceil(n / 256) if n >= 4096 else 8 * n
        elif optimizer == "adafactor":
            total += 4 * (rows + cols) if cols else 4 * n
    return total


class _State(NamedTuple):
    """Parameters, gradients and optimizer state of one mix, in bytes, and the counts the FLOPs need."""

    params: int
    grads: int
    optimizer: int
    host: int
    trainable: int
    lora: int
    """Adapter parameters (0 for a full fine-tune)."""
    quantized: int
    """Parameters stored in 4/8 bits."""


class _Peak(NamedTuple):
    """The activations one micro-batch saves and the peak above the parameters and optimizer state."""

    activations: int
    weight_copies: int
    logits_grads: int
    recompute: int
    backward: int
    """Bytes above params + optimizer at the backward peak."""
    forward: int
    """Bytes above params + optimizer at the end of the forward."""
    moment: str


class _Flops(NamedTuple):
    per_token: int
    recompute_per_token: int
    dequant_bytes: int


class _Mix(NamedTuple):
    """A Hugging Face fine-tune's technique names, checked."""

    finetune: Finetune
    weights: Weights
    optimizer: Optimizer
    attn: Attn
    precision: Precision
    offload: HfOffload


def _checked(finetune: str, weights: str, optimizer: str, attn: str, ckpt: str, precision: str, offload: str,
             micro_batch: int, seq_len: int, accum: int, lora_r: int) -> _Mix:
    """The mix's names checked (``weights`` its default when empty); a :class:`ParamError` for a mix not modelled."""
    ft = check(finetune, FINETUNES, "finetune")
    if not weights:
        weights = {"full": "fp32", "lora": "fp32" if precision == "fp32" else "bf16", "qlora": "nf4"}[ft]
    w = check(weights, WEIGHTS, "weights")
    mix = _Mix(ft, w, check(optimizer, OPTIMIZERS, "optimizer"), check(attn, ATTNS, "attn"),
               check(precision, PRECISIONS, "precision"), check(offload, HF_OFFLOADS, "offload"))
    if ckpt not in ("none", "block"):
        raise ParamError(f"unknown {{ckpt}} {ckpt!r}; use none or block for a Hugging Face model (it checkpoints "
                         f"whole layers)", "ckpt")
    if micro_batch < 1 or seq_len < 1 or accum < 1 or lora_r < 1:
        raise ParamError("{micro_batch}, {seq_len}, {accum} and {lora_r} must be >= 1", "micro_batch", "seq_len",
                         "accum", "lora_r")
    quantized = w in ("int8", "nf4")
    if ft == "qlora" and not quantized:
        raise ParamError(f"{{finetune}} qlora trains adapters over 4/8-bit weights; use {{weights}} nf4 or int8, "
                         f"not {w} (or {{finetune}} lora)", "finetune", "weights")
    if quantized and ft == "full":
        raise ParamError(f"{w} weights cannot be trained directly; use {{finetune}} qlora (or lora)", "finetune")
    if attn == "flash" and precision == "fp32" and w in ("fp32", "int8", "nf4"):
        raise ParamError("{attn} flash runs in 16-bit only; use {precision} bf16 (or {attn} sdpa)", "attn",
                         "precision")
    return mix


def _state(arch: HFArch, targets: tuple[str, ...], weights: Weights, optimizer: str, offload: str,
           lora_r: int, double_quant: bool, lora: bool) -> _State:
    quantized = weights in ("int8", "nf4")
    w = _BYTES.get(weights, 4)
    other = 4 if quantized else w  # what is not quantized: fp32 after prepare_model_for_kbit_training
    params = 0
    trainable: list[tuple[int, int, int]] = []
    n_q = 0
    for kind, rows, cols in arch.param_tensors():
        n = rows * (cols or 1)
        if kind.startswith("linear:") and quantized:
            params += _quant_bytes(n, rows, weights, double_quant)
            n_q += n
        else:
            params += n * other
        if not lora:
            trainable.append((rows, cols, w))
    n_lora = 0
    if lora:
        for lin in arch.linears():
            if lin.name in targets or lin.name.split(".")[-1] in targets:
                trainable += [(lora_r, lin.d_in, 4), (lin.d_out, lora_r, 4)] * arch.n_layer
                n_lora += arch.n_layer * lora_r * (lin.d_in + lin.d_out)
        params += 4 * n_lora
    opt = _optimizer_bytes(trainable, optimizer)
    host = 0
    if offload == "optimizer":
        host, opt = opt, 0
    return _State(params=params, grads=sum(r * (c or 1) * b for r, c, b in trainable), optimizer=opt, host=host,
                  trainable=sum(r * (c or 1) for r, c, _ in trainable), lora=n_lora, quantized=n_q)


def _peak(arch: HFArch, s: Setting, state: _State, micro_batch: int, seq_len: int, accum: int, lora: bool) -> _Peak:
    """The peak of one step of ``accum`` micro-batches: params + optimizer + max(gradients at the end of
    backward, saved activations + logits' gradients + recompute + a dequantized weight); under accumulation
    the earlier micro-batches' gradients are held while the next runs."""
    act = saved_bytes(arch, s, micro_batch, seq_len)
    tokens = micro_batch * seq_len
    logits_grads = tokens * arch.vocab_size * (8 + (2 if s.compute == 2 else 0))
    recompute = act.layer if s.ckpt else 0
    biggest = max(lin.d_in * lin.d_out for lin in arch.linears())
    dequant_live = s.compute * biggest if s.quantized else 0
    live = act.total + logits_grads + recompute + dequant_live
    tied = s.weight * arch.vocab_size * arch.hidden if arch.tied and not lora else 0
    # the tied weight's two partial gradients exist side by side before they are summed; under accumulation
    # the earlier micro-batches' gradient is a third (as the GPT estimator adds: 3 V h w beyond the gradients)
    end = state.grads + (3 if accum > 1 else 2) * tied
    held = state.grads if accum > 1 else 0
    live += held
    return _Peak(activations=act.total, weight_copies=act.weight_copies, logits_grads=logits_grads,
                 recompute=recompute, backward=max(end, live), forward=act.total + held,
                 moment="activations" if live >= end else "gradients")


def _flops(arch: HFArch, s: Setting, state: _State, seq_len: int, weights: str, lora: bool) -> _Flops:
    weight_fl, attn_fl = layer_flops(arch, seq_len)
    head_fl = 2 * arch.hidden * arch.vocab_size
    n_mat = (weight_fl * arch.n_layer + head_fl) // 2
    attention = 3 * attn_fl * arch.n_layer
    flops = (6 * n_mat if not lora else 4 * n_mat + 6 * state.lora) + attention
    refwd = (weight_fl + attn_fl) * arch.n_layer if s.ckpt else 0
    dequant = (state.quantized * (2 + int(s.ckpt)) * (s.compute + (0.52 if weights == "nf4" else 1))
               if s.quantized else 0)
    return _Flops(per_token=flops, recompute_per_token=refwd, dequant_bytes=int(dequant))


def estimate_hf(arch: HFArch, *, micro_batch: int, seq_len: int, finetune: str = "full", lora_r: int = 8,
                lora_targets: tuple[str, ...] | None = None, lora_dropout: float = 0.0, weights: str = "",
                optimizer: str = "adamw", attn: str = "sdpa", ckpt: str = "none", precision: str = "fp32",
                offload: str = "none", accum: int = 1, double_quant: bool = True, cuda: bool = True) -> Estimate:
    """Predict one rank's memory for fine-tuning ``arch``. ``weights`` defaults to fp32 (full; lora
    under --precision fp32), bf16 (lora in 16-bit) or nf4 (qlora)."""
    mix = _checked(finetune, weights, optimizer, attn, ckpt, precision, offload, micro_batch, seq_len, accum, lora_r)
    wdt = mix.weights
    lora = finetune != "full"
    targets = arch.resolve_targets(lora_targets) if lora else ()
    quantized = wdt in ("int8", "nf4")
    w = _BYTES.get(wdt, 4)
    state = _state(arch, targets, wdt, optimizer, offload, lora_r, double_quant, lora)
    s = Setting(trainable="lora" if lora else "full", lora_targets=targets, lora_r=lora_r, lora_dropout=lora_dropout,
                compute=2 if precision != "fp32" or w == 2 else 4,
                autocast=precision != "fp32" and w == 4 or quantized, residual=4 if quantized else w,
                weight=w, quantized=quantized, attn="sdpa" if attn == "flash" else attn, ckpt=ckpt == "block",
                cuda=cuda)
    peak = _peak(arch, s, state, micro_batch, seq_len, accum, lora)
    flops = _flops(arch, s, state, seq_len, wdt, lora)
    fixed = state.params + state.optimizer
    return Estimate(params_bytes=state.params, grads_bytes=state.grads, optimizer_bytes=state.optimizer,
                    activations_bytes=peak.activations, peak_bytes=fixed + peak.backward,
                    forward_peak_bytes=fixed + peak.forward, host_bytes=state.host, recompute_bytes=peak.recompute,
                    flops_per_token=flops.per_token, recompute_flops_per_token=flops.recompute_per_token,
                    weight_copies_bytes=peak.weight_copies, logits_grad_bytes=peak.logits_grads,
                    dequant_bytes=flops.dequant_bytes, n_params=arch.n_params(), trainable_params=state.trainable,
                    peak_moment=peak.moment, micro_batch=micro_batch, seq_len=seq_len, finetune=mix.finetune,
                    weights=wdt, optimizer=mix.optimizer, attn=mix.attn, ckpt=ckpt, precision=mix.precision,
                    offload=mix.offload,
                    lora_r=lora_r if lora else 0, lora_targets=targets)


def hf_fits(arch: HFArch, *, card_bytes: float, seq_len: int, tokens_per_step: int = 0, max_batch: int = 256,
            time_model: Any = None, attn: str = "sdpa", **adapter: Any) -> list[FitOption]:
    """Full, LoRA (bf16 base) and QLoRA (nf4 base, double quantization) mixes in 16-bit compute, with
    and without checkpointing, AdamW or 8-bit AdamW, fastest first; each at its largest micro-batch that
    fits the card at the accumulation it needs (:func:`~gpudash.memmodel.plan.largest_fit`, as gpudash's GPT).
    ``adapter``: lora_r, lora_targets, lora_dropout, double_quant for the LoRA and QLoRA rows."""
    from gpudash.memmodel.steptime import StepTimeModel

    model = time_model or StepTimeModel()
    tokens = tokens_per_step or seq_len
    ref = model.step(estimate_hf(arch, micro_batch=1, seq_len=seq_len, precision="bf16", attn=attn), tokens).total_s
    out = []
    bases: tuple[tuple[Finetune, Weights], ...] = (("full", "fp32"), ("full", "bf16"), ("lora", "bf16"), ("qlora", "nf4"))
    optimizers: tuple[Optimizer, ...] = ("adamw", "adamw8bit")
    for finetune, weights in bases:
        for optimizer in optimizers:
            for ckpt in ("none", "block"):
                kw: dict[str, Any] = {"finetune": finetune, "weights": weights, "optimizer": optimizer,
                                      "ckpt": ckpt, "precision": "bf16", "attn": attn,
                                      **(adapter if finetune != "full" else {})}

                def predict(micro_batch: int, accum: int, kw: dict[str, Any] = kw) -> Estimate:
                    return estimate_hf(arch, micro_batch=micro_batch, seq_len=seq_len, accum=accum, **kw)

                best = largest_fit(predict, card_bytes=card_bytes, seq_len=seq_len, tokens_per_step=tokens_per_step,
                                   limit=max_batch)
                est = best or predict(1, plan_accum(1, seq_len, tokens_per_step))
                t = model.step(est, tokens).total_s
                costs = [f"recompute {ckpt}"] * (ckpt != "none") + [f"dequantize {weights}"] * (weights == "nf4")
                out.append(FitOption(finetune, weights, optimizer, ckpt, "bf16", "none", best.micro_batch if best else 0,
                                     est.peak_bytes, est.host_bytes, t, t / ref - 1, est.trainable_params,
                                     ", ".join(costs) or "none", plan_accum(est.micro_batch, seq_len, tokens_per_step)))
    out.sort(key=lambda f: (f.micro_batch == 0, f.step_s, f.peak_bytes))
    return out


def hf_notes(arch: HFArch, est: Estimate) -> list[str]:
    """Why the numbers look as they do, as sentences (``gpudash estimate`` prints them)."""
    from gpudash.units import human_bytes

    notes: list[str] = []
    frozen = est.n_params - est.trainable_params
    if est.finetune != "full":
        copies = (f" (under autocast, a 16-bit copy of its fp32 weight: {human_bytes(est.weight_copies_bytes)} in all)"
                  if est.weight_copies_bytes else "")
        first = ("" if est.ckpt != "none" else
                 "; what runs before the first adapter keeps nothing (no input there needs a gradient)")
        notes.append(f"{frozen:,} frozen parameters get no gradient and no optimizer state; a frozen matrix saves "
                     f"nothing for backward{copies}, so only the adapters' inputs and what lies between them are "
                     f"kept{first}")
    if est.weights in ("nf4", "int8"):
        n_lin = sum(lin.d_in * lin.d_out for lin in arch.linears()) * arch.n_layer
        other = 4 * (arch.n_params() - n_lin)
        bits = 8 * (est.params_bytes - other - 4 * (est.trainable_params if est.finetune != "full" else 0)) / n_lin
        notes.append(f"{est.weights} decoder weights take {bits:.3f} bits per parameter with their quantization "
                     f"constants; embeddings, head and norms stay fp32 ({human_bytes(other)}), as peft's "
                     f"prepare_model_for_kbit_training casts them; each linear is dequantized to 16 bits per call "
                     f"(one layer's weight at a time)")
    if est.optimizer == "paged_adamw8bit":
        notes.append("paged_adamw8bit's state is counted on the device; bitsandbytes pages it to host RAM "
                     "(unified memory) only when the device runs out")
    if est.peak_moment == "activations":
        notes.append(f"the peak comes early in backward: saved activations ({human_bytes(est.activations_bytes)}), the "
                     f"logits' gradients ({human_bytes(est.logits_grad_bytes)})"
                     + (f" and the layer being recomputed ({human_bytes(est.recompute_bytes)})" if est.recompute_bytes
                        else "") + " alive, few gradients made yet")
    else:
        notes.append(f"the peak comes at the end of backward, when every gradient exists ({human_bytes(est.grads_bytes)})"
                     f" and the activations are freed")
    return notes
