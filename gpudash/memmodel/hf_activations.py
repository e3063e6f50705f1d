"""What autograd saves for backward in a Hugging Face decoder, op by op. Pure Python, no torch.

A small replay of the model's forward over symbolic tensors (element count,
bytes per element, requires-grad, identity), following the rules PyTorch's
autograd formulas use to decide what they save (derivatives.yaml): a matmul
saves its input only when its weight needs a gradient and the weight only when
its input does, an elementwise product saves each side when the other needs a
gradient, softmax and tanh save their output, SiLU/GELU/pow their input,
LayerNorm its input, mean and rstd. Storages are counted once (the q, k, v
projections share one saved input in fp32). That is why LoRA saves far less
than a full fine-tune: a frozen projection whose input needs a gradient saves
nothing (its weight is a parameter), and the first layers before any adapter
save nothing at all. Under autocast (16-bit compute with fp32 weights) every
matmul casts its activation input again (autocast caches only weights that
need a gradient), and a frozen weight's 16-bit copy is made and saved per call.

bitsandbytes ``MatMul4Bit`` / ``MatMul8bitLt`` keep their packed weight on the
autograd context (not through save_for_backward) and no input when the weight is
frozen (bitsandbytes/autograd/_functions.py: ``ctx.tensors = (None, B)``); the
dequantized 16-bit weight is a transient of one layer, in forward and in
backward. That part is not checkable on CPU: scripts/device_check_finetune.py
measures it on a GPU.

The replay is checked tensor by tensor against ``saved_tensors_hooks`` on
random-init scaled-down models of each family (tests/trainer/test_estimator_hf.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

from gpudash.memmodel.hf_arch import HFArch, Linear

__all__ = ["Saved", "Setting", "layer_flops", "saved_bytes"]


@dataclass(frozen=True, slots=True)
class Setting:
    """How the model runs: which weights train, in which dtypes, with which attention kernel."""

    trainable: str = "full"
    """full (every parameter) or lora (only the adapters)."""
    lora_targets: tuple[str, ...] = ()
    lora_r: int = 8
    lora_dropout: float = 0.0
    compute: int = 4
    """Bytes per element of matmul outputs: 4 (fp32), 2 (bf16/fp16)."""
    autocast: bool = False
    """16-bit autocast over fp32 tensors (each matmul casts its inputs)."""
    residual: int = 4
    """Bytes per element of the residual stream (the embedding's dtype)."""
    weight: int = 4
    """Bytes per element of the (unquantized) decoder weights."""
    quantized: bool = False
    """Decoder linears are bitsandbytes 4-/8-bit (frozen, dequantized per call)."""
    attn: str = "sdpa"
    ckpt: bool = False
    """Hugging Face gradient checkpointing: every decoder layer keeps only its input."""
    cuda: bool = True
    """Dropout masks are 1-byte bool on CUDA; on CPU torch keeps a noise tensor of the input dtype."""


@dataclass(slots=True)
class _T:
    numel: int
    b: int
    rg: bool
    id: int


@dataclass(slots=True)
class _Sim:
    arch: HFArch
    s: Setting
    B: int
    T: int
    saved: dict[object, int] = field(default_factory=dict)
    copies: int = 0
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def tok(self) -> int:
        return self.B * self.T

    def new(self, numel: int, b: int, rg: bool) -> _T:
        return _T(numel, b, rg, next(self._ids))

    def save(self, t: _T) -> None:
        self.saved[t.id] = t.numel * t.b

    def cast(self, t: _T, b: int) -> _T:
        return t if t.b == b else self.new(t.numel, b, t.rg)

    def dropout(self, x: _T, p: float) -> _T:
        if p <= 0:
            return x
        if x.rg:
            self.saved[("mask", next(self._ids))] = x.numel * (1 if self.s.cuda else x.b)
        return self.new(x.numel, x.b, x.rg)

    def mul(self, a: _T, b: _T) -> _T:
        if b.rg:
            self.save(a)
        if a.rg:
            self.save(b)
        return self.new(max(a.numel, b.numel), max(a.b, b.b), a.rg or b.rg)

    # ---- modules ---------------------------------------------------------------------------
    def linear(self, x: _T, lin: Linear) -> _T:
        s = self.s
        full = s.trainable == "full"
        lora = s.trainable == "lora" and (lin.name in s.lora_targets or lin.name.split(".")[-1] in s.lora_targets)
        w = s.compute if s.autocast or s.quantized else x.b
        xin = self.cast(x, s.compute) if s.autocast else x
        if full:
            self.save(xin)
        if x.rg and s.autocast and not s.quantized and s.weight != s.compute:
            self.copies += s.compute * lin.d_in * lin.d_out  # the 16-bit weight its backward multiplies by
        out = self.new(self.tok * lin.d_out, w if s.quantized else xin.b, x.rg or full)
        if s.quantized:
            out = self.cast(out, x.b)  # bitsandbytes returns the input's dtype
        if not lora:
            return out
        r = s.lora_r
        xl = self.dropout(x, s.lora_dropout)  # adapters are fp32: peft casts x to their dtype first
        xa = self.cast(xl, s.compute) if s.autocast else self.cast(xl, 4)
        self.save(xa)  # lora_A's input (the adapter's weight needs a gradient)
        a = self.new(self.tok * r, xa.b, True)
        if s.autocast:
            self.copies += s.compute * lin.d_in * r * int(x.rg)
            self.copies += s.compute * r * lin.d_out
        self.save(a)  # lora_B's input
        return self.new(self.tok * lin.d_out, max(out.b, a.b), True)

    def norm(self, x: _T) -> _T:
        s, h = self.s, self.arch.hidden
        trainable = s.trainable == "full"
        rg = x.rg or trainable
        if self.arch.norm == "layer":
            xin = self.cast(x, 4) if s.autocast else x
            if rg:
                self.save(xin)
                self.save(self.new(self.tok, 4, True))  # mean
                self.save(self.new(self.tok, 4, True))  # rstd
            return self.new(self.tok * h, xin.b, rg)
        hx = self.cast(x, 4)  # HF RMSNorm computes in fp32
        if x.rg:
            self.save(hx)
            self.save(self.new(self.tok, 4, True))  # rsqrt(mean(x^2) + eps)
        normed = self.new(self.tok * h, 4, x.rg)
        if self.arch.family == "gemma":
            one_plus_w = self.new(h, 4, trainable)
            out = self.mul(normed, one_plus_w)
            return self.cast(out, x.b)
        y = self.cast(normed, x.b)
        if trainable:
            self.save(y)
        return self.new(self.tok * h, y.b, rg)

    def act(self, x: _T) -> _T:
        if self.arch.mlp != "gelu_new":
            if x.rg:
                self.save(x)  # SiLU / tanh-GELU backward reads its input
            return self.new(x.numel, x.b, x.rg)
        if x.rg:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): pow its input, tanh its output,
            for _ in range(3):  # the last product both sides
                self.save(self.new(x.numel, x.b, True))
            self.saved[x.id] = x.numel * x.b
        return self.new(x.numel, x.b, x.rg)

    def attention(self, q: _T, k: _T, v: _T) -> _T:
        a, s = self.arch, self.s
        nh, hd, B, T = a.n_head, a.head_dim, self.B, self.T
        c = s.compute
        rg = q.rg or k.rg or v.rg
        if a.family != "gpt2":  # rotary: q*cos + rotate_half(q)*sin saves cos and sin (shared by the layers)
            if q.rg or k.rg:
                rot = a.rotary_dim
                self.saved["cos"] = T * rot * self.s.residual
                self.saved["sin"] = T * rot * self.s.residual
            q = self.new(q.numel, max(q.b, s.residual), q.rg)
            k = self.new(k.numel, max(k.b, s.residual), k.rg)
        mask_path = s.attn == "eager" or (not s.cuda and a.attn_dropout > 0)  # CPU sdpa with dropout: math
        if mask_path:
            # sdpa's CPU math fallback (dropout) runs in fp32 under autocast; eager casts to 16 bits
            mm = (c if s.attn == "eager" else 4) if s.autocast else 0
            qm = self.new(self.tok * nh * hd, mm or q.b, q.rg)
            km = self.new(self.tok * nh * hd, mm or k.b, k.rg)  # repeat_kv / reshape copies
            vm = self.new(self.tok * nh * hd, mm or v.b, v.rg)
            if km.rg:
                self.save(qm)
            if qm.rg:
                self.save(km)
            p = self.new(B * nh * T * T, 4, q.rg or k.rg)
            if p.rg:
                self.save(p)  # softmax(dtype=float32) saves its output
            p = self.cast(p, mm or q.b)
            p = self.dropout(p, a.attn_dropout)
            pm = self.cast(p, mm) if s.autocast else p
            if vm.rg:
                self.save(pm)
            if pm.rg:
                self.save(vm)
            return self.new(self.tok * nh * hd, vm.b, rg)  # transpose(1, 2).contiguous()
        ins = [self.cast(t, c) if s.autocast else t for t in (q, k, v)]
        if a.family == "gpt2":  # q, k, v are views of c_attn's one output
            ins = [ins[0]]
            self.saved[ins[0].id] = self.tok * 3 * a.hidden * ins[0].b
        if rg:
            for t in ins:
                self.save(t)
        out = self.new(self.tok * nh * hd, ins[0].b, rg)
        if rg:
            self.save(out)
            self.saved[("lse", next(self._ids))] = B * nh * T * 4
        # phi's rotary concatenates (q_rot, q_pass): its output is head-major and is copied for dense
        return self.new(out.numel, out.b, rg) if a.family == "phi" else out


def _layer(sim: _Sim, x: _T) -> _T:
    a = sim.arch
    lins = {lin.name: lin for lin in a.linears()}
    n1 = sim.norm(x)
    if a.family == "gpt2":
        qkv = sim.linear(n1, lins["c_attn"])
        third = sim.tok * a.hidden
        q = _T(third, qkv.b, qkv.rg, qkv.id)
        o = sim.attention(q, q, q)
        o = sim.dropout(sim.linear(o, lins["attn.c_proj"]), a.resid_dropout)
        x = sim.new(x.numel, max(x.b, o.b), x.rg or o.rg)
        n2 = sim.norm(x)
        f = sim.act(sim.linear(n2, lins["c_fc"]))
        p = sim.dropout(sim.linear(f, lins["mlp.c_proj"]), a.resid_dropout)
        return sim.new(x.numel, max(x.b, p.b), x.rg or p.rg)
    q, k, v = (sim.linear(n1, lins[n]) for n in ("q_proj", "k_proj", "v_proj"))
    o = sim.linear(sim.attention(q, k, v), lins["dense" if a.family == "phi" else "o_proj"])
    if a.family == "phi":  # attention and MLP in parallel on the one norm
        o = sim.dropout(o, a.resid_dropout)
        f = sim.dropout(sim.linear(sim.act(sim.linear(n1, lins["fc1"])), lins["fc2"]), a.resid_dropout)
        return sim.new(x.numel, max(x.b, o.b, f.b), x.rg or o.rg or f.rg)
    x = sim.new(x.numel, max(x.b, o.b), x.rg or o.rg)
    n2 = sim.norm(x)
    g = sim.act(sim.linear(n2, lins["gate_proj"]))
    u = sim.linear(n2, lins["up_proj"])
    d = sim.linear(sim.mul(g, u), lins["down_proj"])
    return sim.new(x.numel, max(x.b, d.b), x.rg or d.rg)


class Saved(NamedTuple):
    """Bytes one forward saves for backward."""

    total: int
    layer: int
    """One decoder layer's (what its recompute holds under checkpointing)."""
    head: int
    """The final norm's, the head's and the loss's."""
    weight_copies: int
    """The 16-bit weight copies autocast saves (part of ``total``)."""


def saved_bytes(arch: HFArch, s: Setting, micro_batch: int, seq_len: int) -> Saved:
    """Bytes saved for backward by one forward: ``total``, ``layer`` (one decoder layer's, for the
    recompute under checkpointing), ``head`` (final norm, head and loss) and ``weight_copies``."""
    sim = _Sim(arch, s, micro_batch, seq_len)
    full = s.trainable == "full"
    tok, h = sim.tok, arch.hidden
    if full:
        sim.saved["ids"] = tok * 8  # the embedding's backward indexes by the ids
    # under checkpointing transformers/peft call enable_input_require_grads: the embedding's output needs a gradient
    x = sim.new(tok * h, s.residual, full or s.ckpt)
    if arch.positions and full:
        sim.saved["pos"] = seq_len * 8
    if arch.family == "gemma" and x.rg:
        sim.saved["normalizer"] = 4  # x * sqrt(hidden) as a 0-d tensor
    if arch.family == "gemma":
        x = sim.new(x.numel, x.b, x.rg)
    x = sim.dropout(x, arch.embd_dropout)
    layer_bytes = 0
    if s.ckpt and arch.family == "gpt2" and s.attn == "eager":
        sim.saved["mask"] = micro_batch * seq_len * seq_len * s.residual  # the 4-D float mask, a checkpoint input
    for _ in range(arch.n_layer):
        before = sum(sim.saved.values())
        if s.ckpt:
            sim.saved[("ckpt", x.id)] = x.numel * x.b
            inner = _Sim(arch, s, micro_batch, seq_len)
            y = _layer(inner, _T(x.numel, x.b, True, -1))
            layer_bytes = max(layer_bytes, sum(inner.saved.values()))
            x = sim.new(y.numel, y.b, True)
        else:
            x = _layer(sim, x)
            layer_bytes = max(layer_bytes, sum(sim.saved.values()) - before)
    before = sum(sim.saved.values())
    n = sim.norm(x)
    if full:
        sim.save(sim.cast(n, s.compute) if s.autocast else n)
    if n.rg and s.autocast and s.residual != s.compute:
        sim.copies += s.compute * h * arch.vocab_size
    sim.saved["log_softmax"] = tok * arch.vocab_size * 4  # HF's loss upcasts the logits to fp32
    sim.saved["targets"] = tok * 8
    sim.saved["total_weight"] = 4
    return Saved(total=sum(sim.saved.values()) + sim.copies, layer=layer_bytes,
                 head=sum(sim.saved.values()) - before, weight_copies=sim.copies)


def layer_flops(arch: HFArch, seq_len: int) -> tuple[int, int]:
    """Forward FLOPs per token of one decoder layer: (matmul weights, attention scores)."""
    weights = 2 * sum(lin.d_in * lin.d_out for lin in arch.linears())
    return weights, 4 * arch.n_head * arch.head_dim * seq_len
