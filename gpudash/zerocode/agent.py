"""The in-process side of ``gpudash run``: records an unchanged training script.

``gpudash run`` starts the script with a private ``sitecustomize`` (``_boot/``)
that loads this module when the script imports torch. It imports only the
standard library at load, because every Python process of the job that imports
torch loads it (the torchrun launcher included); gpudash itself (and its
Monitor) is imported when the first training step starts, so a process that
never trains records nothing.

What it hooks, all process-wide and cheap on the training thread:

- global optimizer step hooks: a step is one step of the *primary* optimizer
  (the first one seen stepping), or with several optimizers made over
  different parameters (a GAN) one iteration of them: it ends with the step
  of the one that steps last in it (``steps.py``). The step runs from the end
  of one such step to the end of the next (the first one from the first
  forward), so step counts equal optimizer steps (iterations); what runs after
  the last optimizer step is not a step. An optimizer step nested in another's
  (SAM's base optimizer) is part of it. A step's ``closure`` (L-BFGS) is
  wrapped: its forwards and backwards are timed as such inside the step, and
  only its first call counts (what ``step()`` returns). ``Optimizer.__init__``
  is watched to know which optimizers the script made.
- without any ``torch.optim`` step (weights updated by hand,
  ``p.data.add_(p.grad, alpha=-lr)``), a step is one ``backward()`` of a loss
  and the update after it (the ``update`` phase); backward calls that
  accumulate into the same gradients (not reset in between) are one step. The
  run meta's ``steps_from`` says which rule counted the steps.
- global module forward hooks on *root* calls (a module call not nested in
  another module's forward). In training mode with grad enabled: the
  ``forward`` phase, and samples (and tokens, for a 2-D integer input) from
  the first positional input of the root module that has parameters, when
  every tensor argument agrees on the first dimension. Under ``no_grad`` /
  ``inference_mode`` or in eval mode: the ``eval`` phase, open until training
  resumes; the losses those calls return (``.loss``, a 0-d tensor, nanoGPT's
  ``(logits, loss)``) are averaged into an ``evaluation`` event's ``eval_loss``
  at the step it ran in. After the first ``NARROW_AFTER`` steps the global
  forward hooks are replaced by hooks on the root modules seen, so other
  module calls cost nothing (a root first called later is not timed).
- ``torch.autograd.backward`` (what ``Tensor.backward`` calls): the
  ``backward`` phase, and the loss: the step's loss is the *sum* of the
  one-element losses passed to ``backward()`` before its optimizer step, the
  objective whose gradient the update applies (a script that divides each
  micro-batch loss by the accumulation count gets the mean it means); each
  other optimizer's as ``loss_<its model>``. Gradients reset between two
  backward calls of one optimizer step mean the loss is evaluated again
  (SAM's second pass, a closure's re-evaluation): not counted. Detached, read by the
  Monitor's writer thread: no GPU sync. ``GradScaler.scale`` is watched so
  the unscaled loss is logged.
- ``torch.save``: the ``checkpoint`` phase.
- ``Monitor.watch`` from the first step on, on the root modules (frozen
  parameters included) and optimizers as they are met: parameters,
  gradients, optimizer state and sampled activations (attributed to the
  primary root's children), as the explicit Monitor records them. A run that
  ends without a step says why (a ``no_steps`` event and ``no_steps_reason``).

HF ``Trainer`` and Lightning ``Trainer``: their ``__init__`` is wrapped to add
gpudash's callback, which records richer steps; the hooks here then step
aside so nothing is counted twice. A script that opens its own
``gpudash.Monitor`` is left to it. Any failure in here prints one
``gpudash:`` line, stops recording and leaves the script running as it would.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import weakref
from typing import Any

ENV_RUN_DIR = "GPUDASH_RUN_DIR"
ENV_OPTIONS = "GPUDASH_RUN_OPTIONS"

__all__ = ["ENV_OPTIONS", "ENV_RUN_DIR", "NARROW_AFTER", "Agent", "get_agent", "on_import"]

#: steps recorded with global forward hooks before they narrow to the root modules seen
NARROW_AFTER = 2


def say(message: str) -> None:
    """gpudash's own messages: stderr, one line, ``gpudash:`` prefix."""
    try:
        print(f"gpudash: {message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr must not break the script
        pass


def _samples_tokens(args: tuple[Any, ...]) -> tuple[int | None, int | None]:
    """(samples, tokens) from a root call's positional inputs, shapes only; None when ambiguous."""
    if not args:
        return None, None
    first = args[0]
    shape = getattr(first, "shape", None)
    if not shape:
        return None, None
    n = int(shape[0])
    for a in args[1:]:
        s = getattr(a, "shape", None)
        if s and int(s[0]) != n:
            return None, None  # tensors disagree on the batch dimension
    tokens = None
    if len(shape) == 2 and not first.is_floating_point() and not first.is_complex():
        tokens = n * int(shape[1])
    return n, tokens


class Agent:
    """Hooks torch and records the process's training steps into ``run_dir``."""

    def __init__(self, run_dir: str, monitor_kwargs: dict[str, Any] | None = None) -> None:
        self.run_dir = run_dir
        self.monitor_kwargs = dict(monitor_kwargs or {})
        self.active = False  # hooks installed and recording
        self.stopped = False  # gave up, stepped aside or delegated: never starts again
        self.monitor: Any = None
        self.session: Any = None  # gpudash.zerocode.steps.Session, once recording
        self.delegated_to: str | None = None
        self._torch: Any = None
        self._handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []
        self._creating = False
        self._depth = 0
        self._call = ""  # the root call in progress: "train", "eval" or "" (not recorded)
        self._in_backward = False
        self._scaled: tuple[Any, Any] | None = None  # (scaled loss, loss) from GradScaler.scale
        self._roots: weakref.WeakSet[Any] | None = weakref.WeakSet()  # None once narrowed
        self._global_forward: list[Any] = []
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  # every torch.optim optimizer made

    @property
    def driver(self) -> Any:
        return None if self.session is None else self.session.driver

    # ---- installing ---------------------------------------------------------------------
    def install(self, torch: Any) -> None:
        if self.active or self.stopped:
            return
        self._torch = torch
        self._depth = 0
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._roots = weakref.WeakSet()  # global forward hooks until NARROW_AFTER steps
        self._global_forward = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, always_call=True),
        ]
        self._handles = [
            *self._global_forward,
            optim_module.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_module.register_optimizer_step_post_hook(self._optimizer_post),
        ]
        self._wrap(optim_module.Optimizer, "__init__", self._make_optimizer_init)
        self._wrap(torch.autograd, "backward", self._make_backward)
        self._wrap(torch, "save", self._make_save)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._wrap(scaler, "scale", self._make_scale)
        self.active = True

    def _narrow(self) -> None:
        """Replace the global forward hooks by hooks on the root modules seen."""
        roots, self._roots = list(self._roots or ()), None
        for h in self._global_forward:
            h.remove()
            self._handles.remove(h)
        self._global_forward = []
        for module in roots:
            self._handles.append(module.register_forward_pre_hook(self._forward_pre))
            self._handles.append(module.register_forward_hook(self._forward_post, always_call=True))

    def _stepped(self) -> None:
        if self.session.steps == NARROW_AFTER and self._roots is not None:
            self._narrow()

    def _wrap(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, functools.wraps(original)(make(original)))
        self._restore.append((owner, name, original))

    def uninstall(self) -> None:
        self.active = False
        for h in self._handles:
            h.remove()
        self._handles = []
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore = []

    def fail(self, exc: BaseException) -> None:
        """gpudash broke: say so once, stop recording, leave the script alone."""
        if self.stopped:
            return
        say(f"stopped recording after an internal error ({type(exc).__name__}: {exc}); the script runs on")
        self.stop("finished", f"gpudash stopped recording: {type(exc).__name__}: {exc}")

    def stop(self, status: str = "finished", reason: str = "closed") -> None:
        self.stopped = True
        try:
            self.uninstall()
        except Exception:  # noqa: BLE001
            pass
        self._close(status, reason)

    def _close(self, status: str, reason: str) -> None:
        s, m = self.session, self.monitor
        if m is None or m.closed:
            return
        try:
            if s is not None and not self.delegated_to:
                s.finish()
        except Exception:  # noqa: BLE001
            pass
        try:
            m.close(status, reason)
        except Exception:  # noqa: BLE001
            pass

    def at_exit(self) -> None:
        self._close("finished", "script exited")

    # ---- starting the Monitor -------------------------------------------------------------
    def _start(self) -> bool:
        """Open the Monitor, watch memory and open the first step; False when recording is off."""
        if self.session is not None:
            return True
        if self.stopped:
            return False
        self._creating = True
        try:
            from gpudash.monitor import Monitor
            from gpudash.zerocode.resume import resume_from_optimizers
            from gpudash.zerocode.steps import Session

            kwargs = dict(self.monitor_kwargs)
            kwargs.setdefault("resume", True)  # a run folder recorded before: steps continue after it
            dist = getattr(self._torch, "distributed", None)
            if dist is not None and dist.is_available() and dist.is_initialized():
                # the process group knows the rank even when no launcher set RANK (mp.spawn)
                kwargs.setdefault("rank", dist.get_rank())
                kwargs.setdefault("world_size", dist.get_world_size())
            monitor = Monitor(self.run_dir, config={"recorded_by": "gpudash run", "argv": list(sys.argv)},
                              **kwargs)
        except Exception as exc:  # noqa: BLE001 - e.g. an unwritable run directory
            say(f"cannot record this run ({exc}); the script runs unrecorded")
            self.stop()
            return False
        finally:
            self._creating = False
        self.monitor = monitor
        resume_from_optimizers(monitor, self._optimizers)  # a script resumed from its checkpoint
        # Python processes this one starts from now on (data workers, a script it runs) would
        # record as the same rank into the same files: they run unrecorded
        os.environ.pop(ENV_RUN_DIR, None)
        atexit.register(self.at_exit)  # after the Monitor's own: runs first
        self.session = Session(monitor, self._torch)
        self.session.constructed = self._optimizers
        return True

    def foreign_monitor(self, monitor: Any) -> None:
        """Someone else opened a Monitor in this process (the script, or a callback)."""
        if self._creating or monitor is self.monitor or self.stopped:
            return
        if self.monitor is None:
            self.stop()
            say("the script records with its own gpudash.Monitor; gpudash run leaves it to that")
        else:
            self.stop("finished", "the script opened its own gpudash.Monitor")

    # ---- hooks (training thread: cheap, never raise) ------------------------------------
    def _forward_pre(self, module: Any, args: tuple[Any, ...]) -> None:
        depth = self._depth
        self._depth = depth + 1
        if depth:
            return
        self._call = ""
        if not self.active:
            return
        try:
            training = module.training and self._torch.is_grad_enabled()
            if self.session is None:
                # evaluation before the first step starts recording only for a module with weights
                if not training and not any(True for _ in module.parameters()):
                    return
                if not self._start():
                    return
            if self._roots is not None:
                self._roots.add(module)
            if training:
                self._call = "train"
                self.session.train_forward(module, args, _samples_tokens)
            else:
                self._call = "eval"
                self.session.eval_forward()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _forward_post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        depth = self._depth - 1
        self._depth = depth if depth > 0 else 0
        if depth > 0 or not self._call or not self.active:
            return
        try:
            if self._call == "eval":
                self.session.eval_output(output)
            else:
                self.session.train_forward_done()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _make_backward(self, original: Any) -> Any:
        agent = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not agent.active or agent._in_backward:
                return original(tensors, *args, **kwargs)
            started = False
            try:
                if agent._start():
                    loss = tensors
                    scaled = agent._scaled
                    if scaled is not None and scaled[0] is loss:
                        loss = scaled[1]
                    agent._scaled = None
                    agent.session.before_backward(loss)
                    started = True
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)
            agent._in_backward = True
            try:
                return original(tensors, *args, **kwargs)
            finally:
                agent._in_backward = False
                if started and agent.active:
                    try:
                        agent.session.after_backward()
                    except Exception as exc:  # noqa: BLE001
                        agent.fail(exc)

        return backward

    def _make_scale(self, original: Any) -> Any:
        agent = self

        def scale(scaler: Any, outputs: Any) -> Any:
            out = original(scaler, outputs)
            if agent.active and out is not outputs:
                agent._scaled = (out, outputs)
            return out

        return scale

    def _make_save(self, original: Any) -> Any:
        agent = self

        def save(*args: Any, **kwargs: Any) -> Any:
            if not agent.active or agent.session is None:
                return original(*args, **kwargs)
            before = None
            try:
                before = agent.session.checkpoint("checkpoint")
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)
            try:
                return original(*args, **kwargs)
            finally:
                if agent.active:
                    try:
                        agent.session.checkpoint(before)  # back to what was open (an evaluation, say)
                    except Exception as exc:  # noqa: BLE001
                        agent.fail(exc)

        return save

    def _make_optimizer_init(self, original: Any) -> Any:
        agent = self

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if agent.active:
                try:
                    agent._optimizers.add(optimizer)
                except Exception as exc:  # noqa: BLE001
                    agent.fail(exc)

        return __init__

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """The step's closure, when it has one, comes back wrapped: its first call is the step's loss."""
        if not self.active:
            return None
        try:
            if self._start() and self.session.optimizer_pre(optimizer):
                if args and callable(args[0]):
                    return (self._closure(args[0]), *args[1:]), kwargs
                if callable(kwargs.get("closure")):
                    return args, {**kwargs, "closure": self._closure(kwargs["closure"])}
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

    def _closure(self, closure: Any) -> Any:
        agent = self

        @functools.wraps(closure)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if agent.active and agent.session is not None:
                try:
                    agent.session.closure_call()
                except Exception as exc:  # noqa: BLE001
                    agent.fail(exc)
            return closure(*args, **kwargs)

        return counted

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active or self.session is None:
            return
        try:
            if self.session.optimizer_post(optimizer):
                self._stepped()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    # ---- frameworks: hand over to their callbacks ------------------------------------------
    def delegate(self, framework: str) -> None:
        """A framework callback records from now on; our hooks step aside."""
        self.delegated_to = framework
        if self.driver is not None:
            self.driver.abandon()
        self.stopped = True
        self.uninstall()

    def attach_hf(self, trainer: Any) -> None:
        from gpudash.zerocode.frameworks import attach_hf

        attach_hf(self, trainer)

    def lightning_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        from gpudash.zerocode.frameworks import lightning_kwargs

        return lightning_kwargs(self, kwargs)


# ---- the process's agent, and what the boot module calls on imports -----------------------
_agent: Agent | None = None
_lock = threading.Lock()


def get_agent() -> Agent | None:
    """The agent configured by ``gpudash run``'s environment (None outside ``gpudash run``)."""
    global _agent
    with _lock:
        if _agent is None:
            run_dir = os.environ.get(ENV_RUN_DIR)
            if not run_dir:
                return None
            from gpudash.options import options_from_json  # stdlib only: cheap in every process of the job

            options, problem = options_from_json(os.environ.get(ENV_OPTIONS))
            if problem and os.environ.get("RANK", "0") == "0":  # once for the job, not once per rank
                say(problem)
            _agent = Agent(run_dir, {"options": options})
        return _agent


def _patch_init(cls: Any, before: Any = None, after: Any = None) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if before is not None:
            try:
                kwargs = before(kwargs)
            except Exception as exc:  # noqa: BLE001
                agent = get_agent()
                if agent is not None:
                    agent.fail(exc)
        original(self, *args, **kwargs)
        if after is not None:
            try:
                after(self)
            except Exception as exc:  # noqa: BLE001
                agent = get_agent()
                if agent is not None:
                    agent.fail(exc)

    cls.__init__ = __init__


def on_import(name: str, module: Any) -> None:
    """Called by the boot module once ``name`` has been imported."""
    agent = get_agent()
    if agent is None:
        return
    if name == "torch":
        agent.install(module)
    elif name == "gpudash.monitor":
        _patch_init(module.Monitor, after=agent.foreign_monitor)
    elif name == "transformers.trainer":
        _patch_init(module.Trainer, after=agent.attach_hf)
    elif name == "lightning.pytorch.trainer.trainer":
        _patch_init(module.Trainer, before=agent.lightning_kwargs)
