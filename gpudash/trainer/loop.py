"""The training loop, under the Monitor.

One optimizer step = one ``monitor.step``: the step's samples are cut into
micro-batches (gradient accumulation), each runs forward and backward, then
the gradients are clipped, checked for NaN/Inf and applied. An OOM anywhere
in the step leaves the ``except`` block at once; the recovery (drop partial
gradients, free the cache, shrink the micro-batch, retry the same samples)
runs outside it, so the traceback no longer pins the failed step's tensors.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from gpudash.analysis.stability import SPIKE_WINDOW, trailing_spike
from gpudash.collectors.env import placement
from gpudash.collectors.oom import record_oom
from gpudash.memmodel.estimator import estimate, estimate_step, safe_micro_batch
from gpudash.memmodel.plan import Estimate
from gpudash.monitor import Monitor
from gpudash.trainer.batching import GROW_BELOW, AdaptiveBatch, BudgetMeter, OOMInjector, tensor_bytes
from gpudash.trainer.checkpointing import apply_checkpointing, parse_mode
from gpudash.trainer.config import TrainConfig
from gpudash.trainer.data import LengthBuckets, MicroBatch, corpus_samples, micro_batches
from gpudash.trainer.model import GPT, preset
from gpudash.trainer.offload import OffloadOptimizer
from gpudash.trainer.precision import Precision
from gpudash.trainer.preflight import preflight
from gpudash.trainer.progressline import ProgressLine
from gpudash.units import GiB, human_bytes

__all__ = ["Trainer", "train"]


def _pick_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("--device cuda but CUDA is not available here; use --device cpu")
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    return torch.device("cpu")


class _SpikeDetector:
    """The live loss-spike check: :func:`gpudash.analysis.stability.trailing_spike` on the last
    ``SPIKE_WINDOW + 1`` losses, so a live event and the post-run analysis flag the same steps."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=SPIKE_WINDOW + 1)

    def check(self, loss: float) -> float | None:
        """Returns the robust z-score when ``loss`` is a spike."""
        self.recent.append(loss if math.isfinite(loss) else math.nan)
        return trailing_spike(self.recent)

    @property
    def median(self) -> float:
        prev = [x for x in list(self.recent)[:-1] if math.isfinite(x)]
        return statistics.median(prev) if prev else math.nan


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        where = placement()  # a bad value is skipped (the Monitor records it) ...
        if where.bad and where.world_size > 1:  # ... but torch.distributed would choke on it
            var, text = where.bad[0]
            raise ValueError(f"{text}: torch.distributed reads it to start {where.world_size} processes; "
                             f"fix the launcher's {var}")
        self.world, self.rank = where.world_size, where.rank
        self.device = _pick_device(cfg.device, where.local_rank or 0)
        if self.world > 1 and cfg.offload != "none":
            raise ValueError("--offload with several ranks is not supported; run one process or drop --offload")
        self.model_cfg = preset(cfg.preset, **cfg.model_overrides)
        self.seq_len = cfg.seq_len or self.model_cfg.block_size
        if self.seq_len > self.model_cfg.block_size:
            raise ValueError(f"--seq-len {self.seq_len} is longer than the {cfg.preset} block size "
                             f"{self.model_cfg.block_size}")
        self.min_len = cfg.min_len or max(2, self.seq_len // 2)
        self.lr_scale = 1.0
        self.tokens_seen = 0
        self.ooms = 0
        self._owns_process_group = False
        self._built = False
        self._predictions: dict[tuple[Any, ...], Estimate] = {}

    # ---- setup -------------------------------------------------------------------------------
    def _capacity(self) -> tuple[float | None, str]:
        cfg = self.cfg
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            if cfg.memory_cap_gb:
                cap = cfg.memory_cap_gb * GiB
                if cap > total:
                    raise ValueError(f"--memory-cap-gb {cfg.memory_cap_gb:g} is more than the card's "
                                     f"{human_bytes(total)}")
                torch.cuda.set_per_process_memory_fraction(cap / total, self.device)
                return cap, f"--memory-cap-gb {cfg.memory_cap_gb:g} (set_per_process_memory_fraction)"
            return float(total), "device total memory"
        if cfg.memory_budget_gb:
            return cfg.memory_budget_gb * GiB, f"--memory-budget-gb {cfg.memory_budget_gb:g} (measured bytes)"
        return None, "none (CPU without --memory-budget-gb)"

    def _techniques(self) -> dict[str, Any]:
        c = self.cfg
        return {"ckpt": c.ckpt, "precision": c.precision, "offload": c.offload, "weights": c.weights}

    def build(self) -> None:
        """Model, optimizer, data, estimate and checklist; ValueError for configs that cannot run."""
        if self._built:
            return
        self._built = True
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            with torch.device(self.device):  # initialise on the device: a 7B model never visits host memory
                model = GPT(self.model_cfg)
                if cfg.weights == "bf16":
                    model = model.to(torch.bfloat16)
        except torch.OutOfMemoryError:
            raise ValueError(f"the {cfg.preset} weights alone do not fit on {self.device}; try `gpudash estimate "
                             f"--preset {cfg.preset} --card-gb N`") from None
        apply_checkpointing(model, parse_mode(cfg.ckpt))
        self.model = model
        self.ddp: Any = None
        if self.world > 1:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
                self._owns_process_group = True
            self.ddp = DistributedDataParallel(self.model, device_ids=[self.device.index]
                                               if self.device.type == "cuda" else None)
        params = list(self.model.parameters())
        self.offload: OffloadOptimizer | None = None
        if cfg.offload != "none":
            self.offload = OffloadOptimizer(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                            offload_grads=cfg.offload == "optimizer+grads")
            self.optimizer: Any = self.offload
        else:
            self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                                               fused=True)
        self.precision = Precision(cfg.precision, self.device, fallback_after=cfg.fallback_after,
                                   min_scale=cfg.min_loss_scale)
        self.capacity, cap_source = self._capacity()
        eff = cfg.effective
        if cfg.micro_fixed is not None:
            start = min(cfg.micro_fixed, eff)
        elif self.capacity is None:
            start = eff
        else:
            start = safe_micro_batch(self.model_cfg, card_bytes=self.capacity, seq_len=self.seq_len,
                                     limit=eff, share=GROW_BELOW, **self._techniques())
            if start == 0:
                static = estimate(self.model_cfg, micro_batch=1, seq_len=self.seq_len, **self._techniques())
                fixed = static.params_bytes + static.optimizer_bytes + static.grads_bytes
                if fixed > self.capacity:
                    raise ValueError(f"{cfg.preset} needs {human_bytes(fixed)} before any activation, more than the "
                                     f"capacity {human_bytes(self.capacity)}; see `gpudash estimate --preset {cfg.preset} "
                                     f"--card-gb N` for a mix that fits")
                start = 1
        self.batch = AdaptiveBatch(eff, start, adaptive=cfg.micro_fixed is None,
                                   max_micro=cfg.max_micro_batch or None)
        self.estimate = estimate(self.model_cfg, micro_batch=start, seq_len=self.seq_len,
                                 accum=self.batch.plan(), **self._techniques())
        self.preflight = preflight(cfg, self.estimate, self.device, self.capacity, cap_source, start)
        self.meter: BudgetMeter | None = None
        if self.device.type == "cpu" and cfg.memory_budget_gb:
            self.meter = BudgetMeter(cfg.memory_budget_gb * GiB, self._static_bytes)
            self.meter.set_params(params)
        self.injector: OOMInjector | None = None
        if cfg.inject_oom_at_batch:
            self.injector = OOMInjector(cfg.inject_oom_at_batch, self.batch)
            self.injector.attach(self.model)
        samples = corpus_samples(cfg.samples, min_len=self.min_len, max_len=self.seq_len,
                                 seed=cfg.seed + 1000 * self.rank)
        self.data = LengthBuckets(samples, eff, seed=cfg.seed + self.rank)
        self.spikes = _SpikeDetector()

    def _static_bytes(self) -> int:
        """Measured bytes that live across steps: parameters, gradients, optimizer state."""
        tensors: list[Any] = []
        for p in self.model.parameters():
            tensors.append(p)
            tensors.append(p.grad)
        for st in self.optimizer.state.values():
            tensors.extend(v for v in st.values() if torch.is_tensor(v))
        return tensor_bytes(tensors)

    def _measured_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))  # allocator bookkeeping: no sync
        return self._static_bytes()

    def _predicted(self, mbs: list[MicroBatch]) -> Estimate:
        """The estimator's prediction for this step at the real shapes of its micro-batches
        (variable-length batches are shorter than --seq-len); cached, shapes repeat."""
        shapes = tuple((int(mb.x.shape[0]), int(mb.x.shape[1])) for mb in mbs)
        key = (shapes, self.precision.mode)
        est = self._predictions.get(key)
        if est is None:
            if len(self._predictions) > 4096:
                self._predictions.clear()
            tech = {**self._techniques(), "precision": self.precision.mode}
            est = self._predictions[key] = estimate_step(self.model_cfg, list(shapes), **tech)
        return est

    def lr_at(self, step: int) -> float:
        c = self.cfg
        if step < c.warmup_steps:
            base = c.lr * (step + 1) / c.warmup_steps
        else:
            progress = (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps)
            base = c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        return base * self.lr_scale

    # ---- one optimizer step ------------------------------------------------------------------
    def _attempt(self, mon: Monitor, step: int, samples: list[list[int]]) -> dict[str, Any] | str:
        """Run the step; returns its numbers, or the OOM message if it ran out of memory."""
        cfg = self.cfg
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.meter is not None:
            self.meter.reset_peak()
        cpu0 = time.thread_time()  # this thread's CPU time: a step cost that other processes do not inflate
        try:
            with mon.step(samples=len(samples)) as st:
                with mon.phase("data"):
                    if cfg.slow_data_ms:
                        time.sleep(cfg.slow_data_ms / 1000)
                    mbs = micro_batches(samples, self.batch.micro, device=self.device)
                    tokens = sum(mb.tokens for mb in mbs)
                st.tokens = tokens
                lr = self.lr_at(step)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                loss_sum = self._forward_backward(mon, step, mbs, tokens)
                stats = self._apply(mon)
                loss_val = float(loss_sum)  # no extra wait: _apply already synced to read the grad norm
                mon.log(loss=loss_val, lr=lr, batch_size=len(samples), micro_batch=self.batch.micro,
                        micro_steps=len(mbs), skipped_steps=self.precision.skipped_steps,
                        thread_cpu_s=time.thread_time() - cpu0,
                        **{k: v for k, v in stats.items() if k != "finite"})
                if self.offload is not None:
                    mon.log_memory(offload_host_bytes=self.offload.state_bytes())
                # the step's measured peak and the estimator's prediction of that same quantity: the
                # allocator's peak on CUDA; under the CPU budget meter, what it counts (parameters,
                # gradients and optimizer state plus saved activations: no backward transients)
                pred = self._predicted(mbs)
                predicted = pred.peak_bytes
                if self.device.type == "cuda":
                    stats["peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
                elif self.meter is not None:
                    stats["peak_bytes"] = self.meter.peak
                    predicted = pred.forward_peak_bytes
                if "peak_bytes" in stats:
                    mon.log_memory(peak_bytes=stats["peak_bytes"])
                mon.log_memory(predicted_peak_bytes=predicted, predicted_activations_bytes=pred.activations_bytes)
                stats["loss"] = loss_val
                stats["tokens"] = tokens
                stats["micro_steps"] = len(mbs)
                self._after_step(mon, step, stats)  # inside the step, so its events carry this step
                return stats
        except torch.OutOfMemoryError as exc:
            return str(exc) or "out of memory"

    def _forward_backward(self, mon: Monitor, step: int, mbs: list[MicroBatch], tokens: int) -> torch.Tensor:
        """Accumulate gradients over the micro-batches; returns the step's mean token loss (on device)."""
        cfg = self.cfg
        model = self.ddp or self.model
        loss_sum = torch.zeros((), device=self.device)
        for i, mb in enumerate(mbs):
            last = i == len(mbs) - 1
            # DDP: all-reduce once per step, on the last micro-batch
            sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
            with sync:
                with mon.phase("forward"):
                    if self.meter is not None:
                        self.meter.begin()
                    try:
                        with self.precision.autocast():
                            loss = model(mb.x, mb.y) / tokens  # sum over this micro-batch / tokens in the step
                    finally:
                        if self.meter is not None:
                            self.meter.end()
                    if step in cfg.inject_nan_at_steps:
                        loss = loss * float("nan")
                    if step in cfg.inject_spike_at_steps:
                        loss = loss * cfg.spike_factor
                with mon.phase("backward"):
                    self.precision.backward(loss)
            if self.offload is not None:
                with mon.phase("offload"):
                    self.offload.after_backward()
            loss_sum += loss.detach()
        return loss_sum

    def _apply(self, mon: Monitor) -> dict[str, Any]:
        """Clip, NaN/Inf guard, optimizer step (or skip), zero grads. Phases do not nest:
        with offload, the copies are ``offload`` and the CPU update is ``optimizer``."""
        cfg = self.cfg
        prec = self.precision
        off = self.offload
        if off is not None:
            with mon.phase("offload"):
                off.gather_grads()
        with mon.phase("optimizer"):
            if off is not None:
                norm = off.clip_(cfg.grad_clip)
            else:
                prec.unscale(self.optimizer)
                params = [p for p in self.model.parameters() if p.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            grad_norm = float(norm)  # the step's one host sync: the NaN/Inf guard needs it
            finite = math.isfinite(grad_norm)
            scale = prec.loss_scale
            if off is not None:
                if finite:
                    off.cpu_step()
                else:
                    prec.skipped_steps += 1
            else:
                prec.step(self.optimizer, finite)
            self.optimizer.zero_grad(set_to_none=True)
        if off is not None and finite:
            with mon.phase("offload"):
                off.push_params()
        out: dict[str, Any] = {"grad_norm": grad_norm if finite else float("nan")}
        if scale is not None:
            out["loss_scale"] = scale
        out["finite"] = finite
        return out

    def _recover(self, mon: Monitor, step: int, error: str, before: int) -> None:
        """Free what the failed step held, shrink the micro-batch, record it all."""
        self.optimizer.zero_grad(set_to_none=True)  # drop partial accumulation
        refused: dict[str, Any] = {}
        if self.meter is not None:
            self.meter.end()
            if self.meter.refused is not None:  # exact numbers: the message rounds them
                refused = {"measured_bytes": self.meter.refused, "budget_bytes": int(self.meter.budget),
                           "capacity_bytes": int(self.meter.budget)}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        after = self._measured_bytes()
        old = self.batch.micro
        new = self.batch.shrink()
        self.ooms += 1
        message = error.splitlines()[0] if error else "out of memory"
        # one OOM, one event: record_oom merges what the allocator's OOM observer saw (CUDA)
        record_oom(mon, error, message=f"out of memory at micro-batch {old}: {message}", micro_batch=old,
                   bytes_before=before, bytes_after=after, leaked_bytes=after - before, **refused)
        if new is None:
            raise MemoryError(f"out of memory even at micro-batch 1 ({message}); "
                              "use more checkpointing, offload, or a shorter --seq-len")
        mon.event("batch_size_change", f"micro-batch {old} -> {new} after OOM "
                  f"(effective batch {self.batch.effective} via {self.batch.plan()} micro-steps)",
                  old=old, new=new, reason="oom", effective=self.batch.effective, micro_steps=self.batch.plan())

    def _after_step(self, mon: Monitor, step: int, stats: dict[str, Any]) -> None:
        if not stats["finite"]:
            mon.event("nan", f"non-finite gradients at step {step}: update skipped",
                      loss=stats["loss"], precision=self.precision.mode)
        reason = self.precision.observe(stats["finite"])
        if reason is not None:
            prev = self.precision.fall_back()
            self.lr_scale *= 0.5
            mon.event("precision_fallback", f"{prev} -> fp32 and learning rate halved: {reason}",
                      old=prev, new="fp32", reason=reason, lr_scale=self.lr_scale)
        z = self.spikes.check(stats["loss"])
        if z is not None:
            mon.event("loss_spike", f"loss {stats['loss']:.3f} is {z:.1f} robust sigma above the median "
                      f"{self.spikes.median:.3f} of the previous {SPIKE_WINDOW} steps", loss=stats["loss"], z=z)
        peak = stats.get("peak_bytes")
        old = self.batch.micro

        def predict(b: int) -> float:
            return float(estimate(self.model_cfg, micro_batch=b, seq_len=self.seq_len, accum=2,
                                  **self._techniques()).peak_bytes)

        new = self.batch.maybe_grow(peak, self.capacity, predict)
        if new is not None:
            mon.event("batch_size_change", f"micro-batch {old} -> {new}: peak {human_bytes(peak or 0)} "
                      f"is under {self.batch.target[0]:.0%} of capacity", old=old, new=new, reason="headroom",
                      effective=self.batch.effective, micro_steps=self.batch.plan())

    # ---- the run -----------------------------------------------------------------------------
    def run(self) -> Path:
        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            want = self.cfg.threads or (1 if self.model_cfg.n_params() < 20_000_000 else threads)
            torch.set_num_threads(want)
        try:
            return self._run()
        finally:
            torch.set_num_threads(threads)  # train() runs in-process: leave the caller's setting as it was

    def _run(self) -> Path:
        cfg = self.cfg
        self.build()
        run_dir = Path(cfg.run_dir)
        with Monitor(run_dir, name=cfg.name or run_dir.name, config=cfg.to_dict(), total_steps=cfg.steps,
                     options=cfg.monitor) as mon:
            mon.watch(self.model, self.optimizer)
            mon.set_meta(trainer={"preset": cfg.preset, "model": self.model_cfg.to_dict(),
                                  "params": self.model_cfg.n_params(), "seq_len": self.seq_len,
                                  "device": str(self.device), "world_size": self.world},
                         estimate=self.estimate.to_dict(), preflight=self.preflight)
            mon.event("preflight", "pre-flight checklist: " + ("; ".join(self.preflight["warnings"]) or "no warnings"),
                      **{k: v for k, v in self.preflight.items() if k != "warnings"})
            for w in self.preflight["warnings"]:
                mon.event("config_warning", w)
            t0 = time.perf_counter()
            progress = ProgressLine(cfg.steps) if cfg.progress and self.rank == 0 else None
            for step in range(cfg.steps):
                samples = next(self.data)
                while True:
                    before = self._measured_bytes()
                    result = self._attempt(mon, step, samples)
                    if not isinstance(result, str):
                        break
                    self._recover(mon, step, result, before)  # outside the except block
                self.tokens_seen += result["tokens"]
                if progress is not None:
                    progress.update(step + 1, result["loss"], self.batch.micro, result["tokens"])
            if progress is not None:
                progress.close()
            mon.set_meta(train_summary={"tokens": self.tokens_seen, "seconds": time.perf_counter() - t0,
                                        "ooms": self.ooms, "skipped_steps": self.precision.skipped_steps,
                                        "final_precision": self.precision.mode,
                                        "final_micro_batch": self.batch.micro})
        if self.offload is not None:
            self.offload.close()
        if self._owns_process_group:
            import torch.distributed as dist

            dist.destroy_process_group()
        return run_dir


def train(cfg: TrainConfig) -> Path:
    """Train as ``cfg`` says under a Monitor writing to ``cfg.run_dir``; returns the run dir."""
    return Trainer(cfg).run()
