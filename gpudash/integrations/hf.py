"""Record a Hugging Face ``transformers.Trainer`` run with gpudash::

    from gpudash.integrations.hf import GpudashCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[GpudashCallback("runs/x")])

Each optimizer step is one Monitor step (gradient-accumulation micro-batches
included), numbered as the Trainer numbers it: the row of the step that makes
``global_step`` *n* is step *n* (from 1; a resumed run from where it resumed),
when the callback opened the Monitor (a Monitor you pass keeps its own count). Phases: ``data`` (fetching the step's batches, which the Trainer
does before it announces the step; evaluation and checkpoint saves are left
out of every step), ``forward`` (the model's forward, loss included, timed by
hooks on the model), ``backward`` (backward plus gradient clipping),
``optimizer`` (``optimizer.step()``) and ``log`` (the Trainer's own logging,
which syncs the GPU to read the loss). Per step: samples and tokens (from the
batch shapes), loss (over the step's micro-batches as the Trainer reduces it,
read off the GPU by the writer thread), lr; ``grad_norm`` as the Trainer reports it, on logging steps (set
``logging_steps=1`` to get it every step). Each evaluation during ``train()``
(the one after the last step too) is an ``evaluation`` event carrying its
metrics (``eval_loss``, ...) at the global step it ran after; so is a
``trainer.evaluate()`` after ``train()`` returned (the run is opened again to
record it, and closed).
Memory by category comes from
``Monitor.watch``; on CUDA the allocator's numbers come with every step.
Every process (rank) records its own file in the same run folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from gpudash.integrations._step import StepDriver, jsonable
from gpudash.monitor import Monitor

__all__ = ["GpudashCallback"]

_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "max_steps",
         "num_train_epochs", "bf16", "fp16", "gradient_checkpointing", "optim", "max_grad_norm",
         "lr_scheduler_type", "weight_decay", "logging_steps", "seed")


class GpudashCallback(TrainerCallback):  # type: ignore[misc]
    """A ``TrainerCallback`` that records the run into ``run_dir``.

    ``run_dir`` is a folder (default: ``<output_dir>/gpudash``) or a
    :class:`gpudash.Monitor` you opened yourself (then you close it).
    ``watch=False`` skips memory by category. Other keywords go to
    :class:`gpudash.Monitor` (``host_hz``, ``memory_every``, ...)."""

    def __init__(self, run_dir: str | os.PathLike[str] | Monitor | None = None, *, watch: bool = True,
                 **monitor_kwargs: Any) -> None:
        self._driver = StepDriver(run_dir, monitor_kwargs)
        self._watch = watch
        self._hooks: list[Any] = []
        self._optimizer: Any = None
        self._loss_is_share = False
        self._loss_scale = 1.0
        self._step_has_loss = False
        self._log_pending = False  # the step waits for on_log (its grad_norm)
        self._between_steps = False  # a step ended; the next opens once log/eval/save are done
        self._reopen: tuple[Any, ...] | None = None  # how to open the run again after train() (evaluate)

    @property
    def monitor(self) -> Monitor | None:
        """The Monitor recording this run (None before training starts)."""
        return self._driver.monitor

    # ---- model hooks: the forward phase, batch shapes and the loss ----------------------
    def _forward_pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        d = self._driver
        if not d.in_step or not module.training:
            return  # evaluation or generation outside a training step
        d.add_batch(kwargs if kwargs.get("input_ids") is not None or not args else args[0])
        # the Trainer passes num_items_in_batch when the model divides its loss by the
        # whole step's token count: the micro-batch losses then add up to the step's loss
        self._loss_is_share = kwargs.get("num_items_in_batch") is not None
        d.phase("forward")

    def _forward_post(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        d = self._driver
        if d.phase_name != "forward":
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is not None:
            d.add_loss(loss)
        d.phase("backward")

    # ---- Trainer events -------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        self._remove_hooks()  # a previous train() that raised never reached on_train_end
        self._driver.abandon()
        self._log_pending = False
        config: dict[str, Any] = {"framework": "transformers", "world_size": args.world_size}
        config.update(jsonable({k: getattr(args, k, None) for k in _ARGS}))
        if model is not None:
            config["model"] = type(model).__name__
            config["parameters"] = sum(p.numel() for p in model.parameters())
            config["model_config"] = _model_config(model)  # the architecture, for the fine-tune estimator
        self._reopen = (Path(args.output_dir or ".") / "gpudash", args.process_index, args.world_size, config)
        m = self._driver.open(*self._reopen)
        if not self._driver.owned:
            m.set_meta(hf_config=config)  # the user's Monitor: keep the Trainer's settings beside theirs
        else:
            if m.step_index == 0:
                m.set_meta(first_step=int(state.global_step or 0) + 1)  # the Trainer's numbering (1, or resumed)
            m.resume_at(int(state.global_step or 0) + 1, f"TrainerState.global_step ({int(state.global_step or 0)})")
        left = int(state.max_steps or 0) - int(state.global_step or 0)  # a resumed run records what is left
        if left > 0 and (self._driver.owned or m.total_steps is None):
            m.set_total_steps(left)
        self._optimizer = optimizer
        # with tokens averaged across ranks each rank's loss is its share of the global mean
        average = getattr(args, "average_tokens_across_devices", False) and args.world_size > 1
        self._loss_scale = float(args.world_size) if average else 1.0
        if model is None:
            return
        if self._watch:
            m.watch(model, getattr(optimizer, "optimizer", optimizer))
        self._hooks = [
            model.register_forward_pre_hook(self._forward_pre, with_kwargs=True),
            model.register_forward_hook(self._forward_post, with_kwargs=True),
        ]
        self._between_steps = True
        self._open_next(control, state)

    def _number(self, state: TrainerState) -> None:
        """The next step is the one that makes ``global_step`` one more (our own Monitor only)."""
        d = self._driver
        if d.owned and d.monitor is not None and not d.in_step:
            d.monitor.step_index = int(state.global_step or 0) + 1

    def _open_next(self, control: TrainerControl, state: TrainerState) -> None:
        """Open the next step in its data phase once nothing else (log, evaluate,
        save) is due before it: those are not part of any step."""
        if self._between_steps and not (control.should_log or control.should_evaluate or control.should_save):
            self._between_steps = False
            self._number(state)
            self._driver.open_ahead()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._between_steps = False
        self._number(state)
        self._driver.begin_step()

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self._driver.phase(None)  # end of this micro-batch's backward

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        self._driver.phase("optimizer")

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        d = self._driver
        d.phase(None)
        groups = getattr(self._optimizer, "param_groups", None)
        if groups:
            d.log(lr=groups[0].get("lr"))  # the rate this step used (the scheduler steps after)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        d = self._driver
        self._step_has_loss = d.has_loss
        if self._loss_is_share:
            d.log_loss("sum", self._loss_scale)
        else:
            d.log_loss("mean")
        if control.should_log:
            d.phase("log")  # the step closes in on_log, so the Trainer's grad_norm lands in its row
            self._log_pending = True
        else:
            d.end_step()
        self._between_steps = True
        self._open_next(control, state)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        d = self._driver
        logs = logs or {}
        if self._log_pending:
            self._log_pending = False
            d.log(grad_norm=logs.get("grad_norm"))
            if "loss" in logs and not self._step_has_loss:
                d.log(loss=logs["loss"])  # the model returned no loss: take the Trainer's average
            d.end_step()
        self._open_next(control, state)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, Any] | None = None, **kwargs: Any) -> None:
        d = self._driver
        if d.owned and d.monitor is not None and d.monitor.closed and self._reopen is not None:
            # trainer.evaluate() after train(): open the run again for it (the rows appended), close it after
            m = d.open(*self._reopen)
            m.step_index = int(state.global_step or 0)
            d.evaluation(metrics or {}, step=int(state.global_step or 0))
            d.close("finished", "trainer finished")
            return
        d.evaluation(metrics or {}, step=int(state.global_step or 0) if d.owned else None)
        self._open_next(control, state)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self._open_next(control, state)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._driver.drop_ahead()  # epoch-end log/evaluate/save come first
        self._between_steps = True
        self._open_next(control, state)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._remove_hooks()
        self._between_steps = self._log_pending = False
        self._driver.close("finished", "trainer finished")

    def _remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _model_config(model: Any) -> dict[str, Any] | None:
    """The model's Hugging Face config as plain JSON (a PEFT model answers with its base model's), so that the
    report's OOM advice can estimate LoRA/QLoRA mixes for this architecture; None when there is none."""
    try:
        cfg = getattr(model, "config", None)
        d = cfg.to_dict() if cfg is not None and hasattr(cfg, "to_dict") else None
    except Exception:  # noqa: BLE001 - a config that cannot describe itself costs the estimate, never the run
        return None
    return jsonable(d) if isinstance(d, dict) and isinstance(d.get("model_type"), str) else None

