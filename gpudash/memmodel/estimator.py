"""Memory estimator: bytes by category for a model shape, batch and technique mix.

Pure arithmetic (no torch), so ``gpudash estimate`` runs anywhere. The
activation model counts what autograd really saves in :class:`GPT` (checked
tensor by tensor against ``saved_tensors_hooks`` in the tests), per token:

    attention half   r*h (LN input) + 8 (LN mean, rstd) + c*h (LN output)
                     + c*3h (qkv) + 4*n_head (SDPA logsumexp) + c*h (attn output)
    MLP half         r*h + 8 + c*h + c*2m (GELU in/out) or c*4m (SwiGLU)
    head             8 (ids) + r*h + 8 + c*h + 4*V (fp32 log-softmax) + 8 (targets)

with h = n_embd, m = MLP width, V = vocab, c = compute bytes (4 fp32, 2 under
autocast), r = residual-stream bytes (the weight dtype). Autocast also keeps
a 16-bit copy of each weight a saved matmul used. A checkpointed region keeps
only its input (r*h per token) and recomputes the rest in backward, so the
peak adds one region's activations while it recomputes.

Peak (steady state, one optimizer step of ``accum`` micro-batches):
``params + optimizer + max(grads + tied, activations + logits grads)`` for
one micro-batch; with accumulation the earlier micro-batches' gradients are
already there, so they add. ``tied`` is the tied embedding's gradient
accumulation at the end of backward: the head's and the embedding's
contributions to the one shared weight exist side by side before they are
summed (2 V h w bytes beyond the gradients; 3 V h w when a gradient from an
earlier micro-batch is added to as well), checked against torch's memory
profiler in the tests.

:func:`estimate_step` predicts one step at the real shapes of its
micro-batches (variable-length batches are shorter than ``seq_len``), and
``forward_peak_bytes`` is the peak at the end of the largest forward, what a
saved-tensor meter (the trainer's CPU ``--memory-budget-gb``) measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from gpudash.memmodel.names import GPT_WEIGHTS, OFFLOADS, PRECISIONS, check, parse_ckpt
from gpudash.memmodel.plan import CARD_SHARE, Estimate, FitOption, ParamError, largest_fit, plan_accum
from gpudash.memmodel.steptime import StepTimeModel
from gpudash.units import human_bytes

__all__ = ["ModelShape", "estimate", "estimate_step", "gpt_fits", "gpt_notes", "safe_micro_batch"]



@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the estimator needs of a model config (a :class:`GPTConfig` has all of it)."""

    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    hidden: int
    gated: bool
    n_params: int
    tied: bool = False
    """The head shares the token embedding's weight (its gradient accumulates from both)."""

    @classmethod
    def of(cls, cfg: Any) -> ModelShape:
        return cls(cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.hidden,
                   cfg.mlp == "swiglu", cfg.n_params(), bool(getattr(cfg, "tie_embeddings", False)))


def activation_parts(shape: ModelShape, tokens: int, c: int, r: int) -> dict[str, int]:
    """Bytes saved for backward by one layer's attention and MLP halves and by the head."""
    h, m, nh, V = shape.n_embd, shape.hidden, shape.n_head, shape.vocab_size
    cast = c < 4  # autocast keeps 16-bit copies of the weights its matmuls saved
    copies = {"attn": cast * c * 4 * h * h, "mlp": cast * c * (3 if shape.gated else 2) * h * m,
              "head": cast * c * V * h}
    attn = tokens * (r * h + 8 + c * h + 3 * c * h + 4 * nh + c * h) + copies["attn"]
    mlp_tok = (4 if shape.gated else 2) * m
    mlp = tokens * (r * h + 8 + c * h + c * mlp_tok) + copies["mlp"]
    head = tokens * (8 + r * h + 8 + c * h + 4 * V + 8) + copies["head"]
    return {"attn": attn, "mlp": mlp, "head": head, "region_input": tokens * r * h,
            **{f"{k}_copies": v for k, v in copies.items()}}


def estimate(cfg: Any, *, micro_batch: int, seq_len: int, ckpt: str = "none", precision: str = "fp32",
             offload: str = "none", weights: str = "fp32", accum: int = 1) -> Estimate:
    """Predict memory for one rank. ``cfg`` is a :class:`GPTConfig` or :class:`ModelShape`."""
    if micro_batch < 1 or seq_len < 1 or accum < 1:
        raise ParamError("{micro_batch}, {seq_len} and {accum} must be >= 1", "micro_batch", "seq_len", "accum")
    return estimate_step(cfg, [(micro_batch, seq_len)] * accum, ckpt=ckpt, precision=precision, offload=offload,
                         weights=weights)


def estimate_step(cfg: Any, shapes: list[tuple[int, int]], *, ckpt: str = "none", precision: str = "fp32",
                  offload: str = "none", weights: str = "fp32") -> Estimate:
    """Predict one optimizer step whose micro-batches have the given (rows, length) shapes, in
    the order they run. The categories and ``micro_batch``/``seq_len`` are the largest micro-batch's."""
    if not shapes:
        raise ParamError("a step needs at least one micro-batch")
    rows = [(int(b), int(t)) for b, t in shapes]
    if any(b < 1 or t < 1 for b, t in rows):
        raise ParamError("{micro_batch} and {seq_len} must be >= 1", "micro_batch", "seq_len")
    shape = cfg if isinstance(cfg, ModelShape) else ModelShape.of(cfg)
    done: dict[tuple[int, int], _Micro] = {}
    for b, t in rows:
        if (b, t) not in done:
            done[(b, t)] = _one_micro(shape, b, t, ckpt, precision, offload, weights)
    parts = [done[r] for r in rows]
    first = parts[0]
    tied = first.tied
    grads = first.grads
    # first micro-batch: no gradients yet; later ones run on top of the accumulated gradients
    backward = max(grads + 2 * tied, first.live)
    moment = "activations" if first.live >= grads + 2 * tied else "gradients"
    forward = first.act
    for p in parts[1:]:
        if grads + max(p.live, 3 * tied) > backward:
            backward = grads + max(p.live, 3 * tied)
            moment = "activations" if p.live >= 3 * tied else "gradients"
        forward = max(forward, grads + p.act)
    est = max(parts, key=lambda p: p.live).estimate
    fixed = est.params_bytes + est.optimizer_bytes
    return replace(est, peak_bytes=fixed + backward, forward_peak_bytes=fixed + forward, peak_moment=moment)


class _Micro(NamedTuple):
    """One micro-batch's bytes: its estimate (the categories), the activations it saves, what is alive at its
    backward peak without the gradients (activations, the logits' gradients, a region recomputing), the
    gradients and the tied head's extra gradient."""

    estimate: Estimate
    act: int
    live: int
    grads: int
    tied: int


def _one_micro(cfg: Any, micro_batch: int, seq_len: int, ckpt: str, precision: str, offload: str,
               weights: str) -> _Micro:
    prec = check(precision, PRECISIONS, "precision")
    off = check(offload, OFFLOADS, "offload")
    wdt = check(weights, GPT_WEIGHTS, "weights", "gpudash's GPT trains fp32 or bf16 weights")
    shape = cfg if isinstance(cfg, ModelShape) else ModelShape.of(cfg)
    mode, every = parse_ckpt(ckpt)
    n = shape.n_params
    w = 4 if weights == "fp32" else 2
    c = 4 if precision == "fp32" and w == 4 else 2
    tokens = micro_batch * seq_len
    parts = activation_parts(shape, tokens, c, w)
    full_layer = parts["attn"] + parts["mlp"]
    act = parts["head"] + seq_len * 8  # + position ids (one row, shared by the batch)
    copies = parts["head_copies"]
    recompute = 0
    h, m, T = shape.n_embd, shape.hidden, seq_len
    attn_flops = 2 * 4 * h * h + 4 * h * T  # projections + QK^T and AV, forward, per token
    mlp_flops = 2 * (3 if shape.gated else 2) * h * m
    flops = 6 * n + 12 * shape.n_layer * h * T
    refwd = 0
    for i in range(shape.n_layer):
        if mode == "block" or (mode == "every" and i % every == 0):
            act += parts["region_input"]
            recompute = full_layer
            refwd += attn_flops + mlp_flops
        elif mode == "attn":
            act += parts["region_input"] + parts["mlp"]
            copies += parts["mlp_copies"]
            recompute = parts["attn"]
            refwd += attn_flops
        elif mode == "mlp":
            act += parts["attn"] + parts["region_input"]
            copies += parts["attn_copies"]
            recompute = parts["mlp"]
            refwd += mlp_flops
        else:
            act += full_layer
            copies += parts["attn_copies"] + parts["mlp_copies"]
    params = n * w
    host = 0
    grads = n * w
    optimizer = 8 * n
    if offload != "none":
        host = 4 * n + 8 * n + 4 * n  # fp32 master weights, Adam moments, fp32 gradients
        optimizer = 0
        if offload == "optimizer+grads":
            # each gradient leaves for the host as soon as backward produces it, through a pinned
            # staging copy in the weight dtype
            grads = w * max(shape.vocab_size * shape.n_embd, shape.n_embd * shape.hidden)
            host += w * n
    elif w != 4:
        raise ParamError("bf16 {weights} need {offload} optimizer (fp32 master weights live on the host)", "weights",
                         "offload")
    logits_grads = tokens * shape.vocab_size * 8  # d(log-softmax) and d(logits), both fp32, side by side
    live = act + logits_grads + recompute
    # tied head: one more V x h tensor per contribution to the shared weight's gradient
    tied = w * shape.vocab_size * shape.n_embd if shape.tied else 0
    est = Estimate(params_bytes=params, grads_bytes=grads, optimizer_bytes=optimizer, activations_bytes=act,
                   peak_bytes=0, forward_peak_bytes=0, host_bytes=host, recompute_bytes=recompute,
                   flops_per_token=flops, recompute_flops_per_token=refwd, weight_copies_bytes=copies,
                   logits_grad_bytes=logits_grads, peak_moment="", micro_batch=micro_batch,
                   seq_len=seq_len, ckpt=ckpt, precision=prec, offload=off, weights=wdt, n_params=n,
                   trainable_params=n)
    return _Micro(estimate=est, act=act, live=live, grads=grads, tied=tied)


def safe_micro_batch(cfg: Any, *, card_bytes: float, seq_len: int, limit: int, share: float = CARD_SHARE,
                     **techniques: Any) -> int:
    """Largest micro-batch (<= ``limit``, the rows of one optimizer step) that fits ``share`` of ``card_bytes``
    at the accumulation it needs to make up the step (:func:`~gpudash.memmodel.plan.largest_fit`); 0 if none."""
    best = largest_fit(_predictor(cfg, seq_len, techniques), card_bytes=card_bytes, seq_len=seq_len,
                       tokens_per_step=max(1, limit) * seq_len, limit=limit, share=share)
    return best.micro_batch if best else 0


def _predictor(cfg: Any, seq_len: int, techniques: dict[str, Any]) -> Callable[[int, int], Estimate]:
    def predict(micro_batch: int, accum: int) -> Estimate:
        return estimate(cfg, micro_batch=micro_batch, seq_len=seq_len, accum=accum, **techniques)

    return predict


_CKPT_COST = {"none": 0, "mlp": 1, "attn": 1, "every-2": 2, "block": 3}
_OFF_COST = {"none": 0, "optimizer": 2, "optimizer+grads": 3}


def gpt_fits(cfg: Any, *, card_bytes: float, seq_len: int, max_batch: int = 512, tokens_per_step: int = 0,
              time_model: StepTimeModel | None = None) -> list[FitOption]:
    """Every technique mix, fastest first by the predicted time of an optimizer step of
    ``tokens_per_step`` tokens (a mix keeps it with gradient accumulation; 0: the time of one sequence,
    and each micro-batch a step of its own),
    with the largest micro-batch that fits the card at the accumulation it needs
    (:func:`~gpudash.memmodel.plan.largest_fit`), its peak there, the host RAM it needs and what its
    checkpointing and offload add to the step time."""
    model = time_model or StepTimeModel()
    tokens = tokens_per_step or seq_len
    out: list[tuple[int, FitOption]] = []
    for weights in GPT_WEIGHTS:
        for offload in OFFLOADS:
            if weights == "bf16" and offload == "none":
                continue
            for precision in PRECISIONS:
                if weights == "bf16" and precision != "bf16":
                    continue
                for ckpt in _CKPT_COST:
                    kw: dict[str, Any] = {"ckpt": ckpt, "precision": precision, "offload": offload, "weights": weights}
                    predict = _predictor(cfg, seq_len, kw)
                    best = largest_fit(predict, card_bytes=card_bytes, seq_len=seq_len, tokens_per_step=tokens_per_step,
                                       limit=max_batch)
                    b = best.micro_batch if best else 0
                    est = best or predict(1, plan_accum(1, seq_len, tokens_per_step))
                    t = model.step(est, tokens)
                    costs = []
                    if ckpt != "none":
                        costs.append(f"recompute {ckpt}")
                    if offload != "none":
                        costs.append(f"offload {offload} over PCIe, optimizer step on CPU")
                    if weights == "bf16":
                        costs.append("bf16 weights")
                    cost = _CKPT_COST[ckpt] + _OFF_COST[offload] + (precision == "fp32") * 2 + (weights == "bf16")
                    out.append((cost, FitOption("full", weights, "adamw", ckpt, precision, offload, b, est.peak_bytes,
                                                est.host_bytes, t.total_s, t.total_s / t.compute_s - 1, est.n_params,
                                                ", ".join(costs) or "none", plan_accum(est.micro_batch, seq_len,
                                                                                       tokens_per_step))))
    out.sort(key=lambda t: (t[1].micro_batch == 0, t[1].step_s, t[0], -t[1].micro_batch))
    return [o for _, o in out]


def gpt_notes(cfg: Any, est: Estimate) -> list[str]:
    """Why an estimate's numbers look as they do, as sentences (``gpudash estimate`` prints them):
    16-bit activations above fp32's (autocast's weight copies), a peak below the sum of the
    categories (they do not all peak at the same moment)."""
    notes: list[str] = []
    if est.weight_copies_bytes:
        kw: dict[str, Any] = {"seq_len": est.seq_len, "ckpt": est.ckpt, "offload": est.offload}
        fp32 = estimate(cfg, micro_batch=est.micro_batch, precision="fp32", weights="fp32", **kw)
        if est.activations_bytes > fp32.activations_bytes:
            one16 = estimate(cfg, micro_batch=1, precision=est.precision, weights=est.weights, **kw)
            one32 = estimate(cfg, micro_batch=1, precision="fp32", weights="fp32", **kw)
            per_sample = one32.activations_bytes - (one16.activations_bytes - one16.weight_copies_bytes)
            from_batch = est.weight_copies_bytes // per_sample + 1 if per_sample > 0 else None
            notes.append(
                f"{est.precision} activations ({human_bytes(est.activations_bytes)}) exceed fp32's "
                f"({human_bytes(fp32.activations_bytes)}) at micro-batch {est.micro_batch}: autocast saves a 16-bit copy "
                f"of every weight its matmuls use, for backward ({human_bytes(est.weight_copies_bytes)}, the same at "
                f"any batch size), and halving the saved tensors saves only {human_bytes(per_sample)} per sample"
                + (f"; from micro-batch {from_batch} on, {est.precision} activations are the smaller"
                   if from_batch else ""))
    total = est.params_bytes + est.grads_bytes + est.optimizer_bytes + est.activations_bytes
    if est.peak_bytes < total:
        head = (f"the predicted peak ({human_bytes(est.peak_bytes)}) is below the sum of the categories "
                f"({human_bytes(total)}) because they do not all peak at the same moment: ")
        if est.peak_moment == "activations":
            recompute = (f" and a checkpointed region being recomputed ({human_bytes(est.recompute_bytes)})"
                         if est.recompute_bytes else "")
            notes.append(head + f"it comes early in backward, with the saved activations, the logits' gradients "
                         f"({human_bytes(est.logits_grad_bytes)}){recompute} alive and few gradients made yet; backward "
                         f"frees each layer's activations as it makes that layer's gradients, so all the gradients "
                         f"({human_bytes(est.grads_bytes)}) never meet all the activations")
        else:
            extra = est.peak_bytes - est.params_bytes - est.optimizer_bytes - est.grads_bytes
            tied = f", with the tied embedding's two partial gradients ({human_bytes(extra)}) on top," if extra > 0 else ""
            notes.append(head + f"it comes at the end of backward, when every gradient exists "
                         f"({human_bytes(est.grads_bytes)}){tied} and the activations "
                         f"({human_bytes(est.activations_bytes)}) are already freed")
    return notes

