"""Memory by category: parameters, gradients, optimizer state, activations.

Parameters, gradients and optimizer state are tensors we can enumerate; each
storage is counted once (views and DDP buckets share storage). Activations
are what autograd saves for backward: on sampled steps a
``torch.autograd.graph.saved_tensors_hooks`` pair sees every saved tensor and
attributes its storage to the innermost watched module running at that time
(parameter storages excluded): :mod:`gpudash.collectors.activations`, whose
hooks are process-wide, never on a module, and keep no tensor. Under gradient checkpointing, torch's own
hooks take over inside the checkpointed region, so only what is really kept
is counted: this is how the dashboard shows what checkpointing saves.

Hooks are installed only on sampled steps, chosen by :class:`StepSchedule`, a rule of step numbers
alone: the first :data:`FULL_STEPS` steps after the first, then gaps that double up to a cap set by
``activations_budget``; ``activations_every=N`` fixes the schedule for a whole run. Which steps a run's
peak is measured at never depends on timing or on how loaded the machine was (two identical runs give
the same peak, and a gate on it holds).

The categories of a row describe one moment, so their sum never exceeds the
step's measured peak (``peak_bytes``): the end of the forward pass of the
step's largest forward/backward cycle (micro-batch), where saved activations
peak. ``activations_bytes`` is what that cycle saved (the largest cycle, not a
sum over micro-batches: each backward frees its own); ``grads_bytes`` is the
gradient memory held while it ran (0 in a one-micro-batch step whose
gradients were freed by ``zero_grad(set_to_none=True)``; all of them from the
second micro-batch of an accumulating step on); ``optimizer_bytes`` is the
state that existed when the step began (none in the first step: the optimizer
creates it after that step's backward). ``grads_total_bytes`` is the
gradient memory after the step's last backward, for reference. On steps
without activation sampling, ``grads_bytes`` is the most gradient memory any
cycle ran with.

``trainable_params_bytes`` is the part of ``params_bytes`` that requires grad (LoRA adapters beside a
frozen base). Quantized weights (bitsandbytes ``Params4bit`` / ``Int8Params``, told by class name so
bitsandbytes need not be importable) count by the bytes their storage holds, quantization
constants included; the run meta's ``params_dtypes`` names each weight dtype and its bytes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpudash.collectors.activations import OUTSIDE, ActivationProbe, storage_of
from gpudash.collectors.base import try_import_torch

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["FULL_STEPS", "OUTSIDE", "QUANTIZED_CLASSES", "CategoryCollector", "StepSchedule", "param_storages",
           "watched_modules"]

#: Parameter classes that hold quantized weights (bitsandbytes), by class name: their storage is the truth.
QUANTIZED_CLASSES = ("Params4bit", "Int8Params")
FULL_STEPS = 8
"""Steps after the first whose activations are all measured under the default rule (a step-count rule, not a
timer's: identical runs measure the same steps)."""


class StepSchedule:
    """Which steps measure activations: a rule of step numbers alone, so identical runs measure the same steps
    however loaded the machine is, and a run's peak (and the gate on it) never depends on timing (issue 41).

    Steps count from the run's first step ``s0`` (the first step is not measured: it compiles, warms up,
    evaluates). With ``fixed`` N: steps ``s0 + 1``, ``s0 + 1 + N``, ... Otherwise the :data:`FULL_STEPS` steps
    after the first, then ``s0 + 16, 32, 64, ...`` (the gap doubling) up to ``cap``, then every ``cap``-th step:
    a run of n steps measures about ``FULL_STEPS + log2(cap) + n / cap`` steps. ``cap`` is the power of two at
    or above ``1 / budget`` (256 at the default 0.5 %: a measured step costing a plain step's time again adds
    under 0.4 % to a long run), at most ``max_every``."""

    def __init__(self, fixed: int, budget: float, max_every: int = 1024) -> None:
        self.fixed = fixed
        want = 1.0 / budget if budget > 0 else float(max_every)
        self.cap = fixed or min(max_every, 1 << max(0, math.ceil(math.log2(max(want, 1.0)))))
        self.first: int | None = None
        """The run's first step (None until it starts)."""

    def due(self, step: int) -> bool:
        if self.first is None:
            return False
        r = step - self.first
        if r < 1:
            return False
        if self.fixed:
            return (r - 1) % self.fixed == 0
        return r <= FULL_STEPS or r % self.cap == 0 or (r < self.cap and r & (r - 1) == 0)

    def every(self, step: int) -> int:
        """Steps from ``step`` (a measured one) to the next measured one."""
        if self.fixed:
            return self.fixed
        r = step - (self.first or 0)
        return 1 if r < FULL_STEPS else min(max(r, 1), self.cap)


def watched_modules(model: Any, max_depth: int = 3) -> list[tuple[str, Any]]:
    """Top-level modules worth attributing activations to: children of the model,
    with plain containers (ModuleList/ModuleDict/Sequential) opened up so each
    transformer block gets its own line."""
    torch = try_import_torch()
    containers: tuple[type, ...] = ()
    if torch is not None:
        nn = torch.nn
        containers = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, module: Any, depth: int) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if isinstance(child, containers) and depth < max_depth:
                walk(full + ".", child, depth + 1)
            elif depth == 0 and not any(True for _ in child.parameters(recurse=False)) \
                    and len(list(child.children())) > 1 and depth < max_depth:
                walk(full + ".", child, depth + 1)
            else:
                out.append((full, child))

    walk("", model, 0)
    return out


def _quant_constants(p: Any) -> list[Any]:
    """The tensors a quantized parameter keeps beside its storage (bitsandbytes ``quant_state``: absmax, code,
    nested state; ``Int8Params.SCB``)."""
    out: list[Any] = []
    state = getattr(p, "quant_state", None)
    while state is not None and len(out) < 16:
        for name in ("absmax", "code", "offset"):
            t = getattr(state, name, None)
            if hasattr(t, "untyped_storage"):
                out.append(t)
        state = getattr(state, "state2", None)
    scb = getattr(p, "SCB", None)
    if hasattr(scb, "untyped_storage"):
        out.append(scb)
    return out


def param_storages(params: list[Any]) -> tuple[dict[int, int], dict[int, int], dict[str, int]]:
    """(all storages, trainable storages, bytes per dtype name) of ``params``, each storage once.

    A quantized parameter is named by its class and storage dtype (``uint8 (Params4bit)``)."""
    seen: dict[int, int] = {}
    trainable: dict[int, int] = {}
    dtypes: dict[str, int] = {}
    for p in params:
        cls = type(p).__name__
        extra = _quant_constants(p) if cls in QUANTIZED_CLASSES else []
        name = str(getattr(p, "dtype", "?")).removeprefix("torch.") + (f" ({cls})" if cls in QUANTIZED_CLASSES else "")
        for t in (p, *extra):
            s = storage_of(t)
            if s is None or s[0] in seen:
                continue
            seen[s[0]] = s[1]
            dtypes[name] = dtypes.get(name, 0) + s[1]
            if getattr(p, "requires_grad", False):
                trainable[s[0]] = s[1]
    return seen, trainable, dtypes


class CategoryCollector:
    name = "memory"

    def __init__(self, model: Any, optimizer: Any = None, *, memory_every: int = 1,
                 activations_every: int = 0, activations_budget: float = 0.005) -> None:
        self.model = model
        self.optimizer = optimizer
        self.params = [p for p in model.parameters()]
        self.memory_every = memory_every
        self.act_sampler = StepSchedule(activations_every, activations_budget)
        self._monitor: Recording | None = None
        self._param_ptrs: set[int] = set()
        self._params_bytes = 0
        self._trainable_bytes = 0
        self._dtypes: dict[str, int] = {}
        self._opt_cache: tuple[int, int, int] = (-1, 0, 0)
        self._opt_calls = 0
        self._modules = watched_modules(model)
        torch = try_import_torch()
        self._probe = None if torch is None else ActivationProbe(torch, self._in_backward)
        self._peak_cycle: dict[str, int] = {}
        self._peak_counts: dict[str, int] = {}
        self._on_cuda = False
        self._next_step = 0
        self._grads_total = 0
        self._held = 0  # gradient bytes held when the current cycle began
        self._held_max = 0  # the most any completed cycle of this step began with
        self._peak_held = 0  # held by the sampled step's largest cycle
        self._opt_at_start: int | None = None  # state bytes when the step began (= the last step's end)
        self._cycles = 0

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, monitor: Recording) -> None:
        self._monitor = monitor
        self._refresh_params()
        monitor.add_step_hooks(self.on_step_start, self.on_step_end, self.on_phase_end)

    def stop(self) -> None:
        self._uninstall()

    def refresh(self) -> None:
        """Read the model's parameters again (``gpudash run`` learns of a model's optimizers as they step)."""
        self.params = [p for p in self.model.parameters()]
        self._modules = watched_modules(self.model)
        self._refresh_params()

    def _refresh_params(self) -> None:
        self._on_cuda = any(getattr(p, "device", None) is not None and p.device.type == "cuda" for p in self.params)
        seen, trainable, dtypes = param_storages(self.params)
        self._param_ptrs = set(seen)
        self._params_bytes = sum(seen.values())
        self._trainable_bytes = sum(trainable.values())
        if dtypes != self._dtypes and self._monitor is not None:
            self._monitor.set_meta(params_dtypes=dtypes)
        self._dtypes = dtypes

    # ---- training thread ----------------------------------------------------------------
    def on_step_start(self, step: int) -> None:
        self._next_step = step
        if self.act_sampler.first is None:  # frameworks number steps their own way (HF: from 1): skip the first
            self.act_sampler.first = step
        if self.act_sampler.due(step):
            self._install()
        self._grads_total = 0
        self._held_max = -1
        self._held = self._grads_bytes() if self.step_due else 0
        if self._opt_at_start is None and self.step_due:
            self._opt_at_start = self._optimizer_bytes()[0]

    def on_phase_end(self, name: str) -> None:
        if name not in ("backward", "offload") or not self.step_due:
            return
        # gradients are often freed by zero_grad() before the step ends: read them when
        # backward finishes, where they peak; what is left after an offload copy (or
        # after backward) is what the next micro-batch's forward runs with
        grads = self._grads_bytes()
        if name == "offload":
            self._held = grads
            return
        self._grads_total = max(self._grads_total, grads)
        self._held_max = max(self._held_max, self._held)
        # under gradient accumulation each micro-batch's activations are freed by its
        # backward: the step's activation memory is the largest micro-batch, not the sum
        if self._measuring:
            self._close_cycle()
        self._held = grads

    @property
    def step_due(self) -> bool:
        return self._measuring or self._next_step % self.memory_every == 0

    def on_step_end(self, step: int, row: dict[str, Any]) -> None:
        self._next_step = step + 1
        sampled = self._measuring
        if sampled:
            self._uninstall()
        if row.get("failed"):
            return  # no row for a failed attempt (an OOM the loop retries): its retry is sampled instead
        if step % self.memory_every and not sampled:
            return
        mem: dict[str, Any] = {"step": step, "time": row["time"], "params_bytes": self._params_bytes,
                               "trainable_params_bytes": self._trainable_bytes}
        if self._held_max < 0:  # no backward phase recorded: one cycle, run with what the step began with
            self._held_max = self._held
            self._grads_total = max(self._held, self._grads_bytes())
        mem["grads_bytes"] = self._held_max
        mem["grads_total_bytes"] = self._grads_total
        opt_dev, opt_host = self._optimizer_bytes()
        # what the step's forward ran with: the state does not change between one step's end and the next
        mem["optimizer_bytes"] = min(opt_dev, opt_dev if self._opt_at_start is None else self._opt_at_start)
        self._opt_at_start = opt_dev
        if opt_host:
            mem["optimizer_host_bytes"] = opt_host
        if sampled:
            act = self._flush_activations(step, row["time"])
            mem["activations_bytes"] = act
            mem["grads_bytes"] = self._peak_held
            mem["activations_every"] = self.act_sampler.every(step)
        monitor = self._monitor
        assert monitor is not None
        monitor.memory_row(step, mem)

    def _grads_bytes(self) -> int:
        seen: dict[int, int] = {}
        for p in self.params:
            g = p.grad
            if g is not None:
                s = storage_of(g)
                if s is not None:
                    seen[s[0]] = s[1]
        return sum(seen.values())

    def _optimizer_bytes(self) -> tuple[int, int]:
        opt = self.optimizer
        if opt is None:
            return 0, 0
        state = getattr(opt, "state", None)
        if state is None:
            return 0, 0
        self._opt_calls += 1
        n = len(state)
        cached_n, dev, host = self._opt_cache
        if n == cached_n and self._opt_calls % 100:
            return dev, host
        seen: dict[int, tuple[int, bool]] = {}
        for st in list(state.values()):
            if not isinstance(st, dict):
                continue
            for v in st.values():
                if hasattr(v, "untyped_storage"):
                    s = storage_of(v)
                    if s is not None:
                        seen[s[0]] = (s[1], self._on_cuda and v.device.type == "cpu")
        dev = sum(b for b, h in seen.values() if not h)
        host = sum(b for b, h in seen.values() if h)
        self._opt_cache = (n, dev, host)
        return dev, host

    # ---- activations --------------------------------------------------------------------
    @property
    def _measuring(self) -> bool:
        return self._probe is not None and self._probe.installed

    def _in_backward(self) -> bool:
        monitor = self._monitor
        return monitor is not None and monitor.current_phase == "backward"

    def _install(self) -> None:
        probe = self._probe
        if probe is None:
            return
        self._peak_cycle, self._peak_counts = {}, {}
        self._peak_held = 0
        self._cycles = 0
        probe.watch(self._modules, self._param_ptrs)
        probe.install()

    def _uninstall(self) -> None:
        if self._probe is not None:
            self._probe.uninstall()

    def _close_cycle(self) -> None:
        """End one forward/backward cycle: keep the per-module bytes of the cycle whose
        forward ended highest (its saved activations plus the gradients it ran with)."""
        assert self._probe is not None
        per, counts = self._probe.take_cycle()
        if sum(per.values()) + self._held >= sum(self._peak_cycle.values()) + self._peak_held:
            self._peak_cycle = per
            self._peak_counts = counts
            self._peak_held = self._held
        self._cycles += 1

    def _flush_activations(self, step: int, t: float) -> int:
        assert self._probe is not None
        if self._probe.seen or not self._cycles:  # a forward without a recorded backward phase
            self._close_cycle()
        self._cycles = 0
        per = self._peak_cycle
        counts = self._peak_counts
        self._peak_cycle, self._peak_counts = {}, {}
        monitor = self._monitor
        assert monitor is not None
        for module, nbytes in per.items():
            monitor.put("activations", {"step": step, "time": t, "module": module,
                                                 "bytes": nbytes, "tensors": counts.get(module, 0)})
        return sum(per.values())
