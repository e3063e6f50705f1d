"""The in-process side of ``gpudash run``: records an unchanged training script.

``gpudash run`` starts the script with a private ``sitecustomize`` (``_boot/``)
that loads this module when the script imports torch. It imports only the
standard library at load, because every Python process of the job that imports
torch loads it (the torchrun launcher included); gpudash itself (and its
Monitor) is imported when the first training step starts, so a process that
never trains records nothing.

What it hooks, all process-wide and cheap on the training thread:

- global optimizer step hooks: a step is one step of the *primary* optimizer
  (the first one seen stepping); other optimizers' steps fall inside it. The
  step runs from the end of one primary step to the end of the next (the first
  one from the first training forward), so step counts equal optimizer steps;
  what runs after the last optimizer step is not a step.
- global module forward hooks on *root* calls (a module call not nested in
  another module's forward, in training mode with grad enabled): the
  ``forward`` phase, and samples (and tokens, for a 2-D integer input) from
  the first positional input of the root module that has parameters, when
  every tensor argument agrees on the first dimension. After the first
  ``NARROW_AFTER`` steps the global forward hooks are replaced by hooks on
  the root modules seen training, so other module calls cost nothing (a root
  first called later is not timed).
- ``torch.autograd.backward`` (what ``Tensor.backward`` calls): the
  ``backward`` phase, and the loss when it is a one-element tensor (detached,
  read by the Monitor's writer thread: no GPU sync). ``GradScaler.scale`` is
  watched so the unscaled loss is logged.
- ``Monitor.watch`` on the optimizers' param groups: parameters, gradients,
  optimizer state and sampled activations (attributed to the primary root's
  children), as the explicit Monitor records them.

HF ``Trainer`` and Lightning ``Trainer``: their ``__init__`` is wrapped to add
gpudash's callback, which records richer steps; the hooks here then step
aside so nothing is counted twice. A script that opens its own
``gpudash.Monitor`` is left to it. Any failure in here prints one
``gpudash:`` line, stops recording and leaves the script running as it would.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import weakref
from collections import ChainMap
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


class _Params:
    """What ``CategoryCollector`` reads as the model: the optimizers' parameters,
    and the primary root module's children for activations."""

    def __init__(self, optimizers: list[Any], root: Any) -> None:
        seen: dict[int, Any] = {}
        for opt in optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    seen.setdefault(id(p), p)
        self._params = list(seen.values())
        self._root = root

    def parameters(self) -> list[Any]:
        return self._params

    def named_children(self) -> Any:
        return self._root.named_children() if self._root is not None else iter(())


class _States:
    """The optimizers' states as one mapping (what ``CategoryCollector`` reads)."""

    def __init__(self, optimizers: list[Any]) -> None:
        self.state: ChainMap[Any, Any] = ChainMap(*[opt.state for opt in optimizers])

    def add(self, optimizer: Any) -> None:
        self.state.maps.append(optimizer.state)


class Agent:
    """Hooks torch and records the process's training steps into ``run_dir``."""

    def __init__(self, run_dir: str, monitor_kwargs: dict[str, Any] | None = None) -> None:
        self.run_dir = run_dir
        self.monitor_kwargs = dict(monitor_kwargs or {})
        self.active = False  # hooks installed and recording
        self.stopped = False  # gave up, stepped aside or delegated: never starts again
        self.monitor: Any = None
        self.driver: Any = None
        self.delegated_to: str | None = None
        self._torch: Any = None
        self._handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []
        self._creating = False
        self._depth = 0
        self._train_call = False
        self._root: Any = None  # weakref to the primary root module
        self._primary: Any = None  # weakref to the primary optimizer
        self._optimizers: list[Any] = []  # weakrefs
        self._states: _States | None = None
        self._in_backward = False
        self._scaled: tuple[Any, Any] | None = None  # (scaled loss, loss) from GradScaler.scale
        self._ambiguous = False
        self._roots: weakref.WeakSet[Any] | None = weakref.WeakSet()  # None once narrowed
        self._global_forward: list[Any] = []
        self._steps = 0

    # ---- installing ---------------------------------------------------------------------
    def install(self, torch: Any) -> None:
        if self.active or self.stopped:
            return
        self._torch = torch
        self._depth = 0
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._roots = weakref.WeakSet()  # global forward hooks until NARROW_AFTER steps
        self._steps = 0
        self._global_forward = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, always_call=True),
        ]
        self._handles = [
            *self._global_forward,
            optim_module.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_module.register_optimizer_step_post_hook(self._optimizer_post),
        ]
        self._wrap(torch.autograd, "backward", self._make_backward)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._wrap(scaler, "scale", self._make_scale)
        self.active = True

    def _narrow(self) -> None:
        """Replace the global forward hooks by hooks on the root modules seen training."""
        roots, self._roots = list(self._roots or ()), None
        for h in self._global_forward:
            h.remove()
            self._handles.remove(h)
        self._global_forward = []
        for module in roots:
            self._handles.append(module.register_forward_pre_hook(self._forward_pre))
            self._handles.append(module.register_forward_hook(self._forward_post, always_call=True))

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
        d, m = self.driver, self.monitor
        if m is None or m.closed:
            return
        try:
            if d is not None and not self.delegated_to:
                d.abandon()  # what ran after the last optimizer step is not a step
            m.close(status, reason)
        except Exception:  # noqa: BLE001
            pass

    def at_exit(self) -> None:
        self._close("finished", "script exited")

    # ---- starting the Monitor -------------------------------------------------------------
    def _start(self) -> bool:
        """Open the Monitor and the first step; False when recording is off."""
        if self.driver is not None:
            return True
        if self.stopped:
            return False
        self._creating = True
        try:
            from gpudash.integrations._step import StepDriver
            from gpudash.monitor import Monitor

            kwargs = dict(self.monitor_kwargs)
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
        self.driver = StepDriver(monitor, {})
        # Python processes this one starts from now on (data workers, a script it runs) would
        # record as the same rank into the same files: they run unrecorded
        os.environ.pop(ENV_RUN_DIR, None)
        atexit.register(self.at_exit)  # after the Monitor's own: runs first
        self.driver.begin_step()
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
        try:
            self._train_call = module.training and self._torch.is_grad_enabled()
            if not self._train_call or not self.active or not self._start():
                return
            d = self.driver
            if d.phase_name is None:
                d.phase("forward")
            if self._roots is not None:
                self._roots.add(module)
            root = self._root() if self._root is not None else None
            if root is None and any(True for _ in module.parameters()):
                self._root = weakref.ref(module)
                root = module
            if module is root:
                samples, tokens = _samples_tokens(args)
                if samples is None:
                    self._ambiguous = True
                else:
                    d.samples += samples
                    d.tokens += tokens or 0
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _forward_post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        depth = self._depth - 1
        self._depth = depth if depth > 0 else 0
        if depth > 0 or not self._train_call or not self.active:
            return
        try:
            d = self.driver
            if d is not None and d.phase_name == "forward":
                d.phase(None)
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
                    d = agent.driver
                    d.phase("backward")
                    started = True
                    loss = tensors
                    scaled = agent._scaled
                    if scaled is not None and scaled[0] is loss:
                        loss = scaled[1]
                    agent._scaled = None
                    if isinstance(loss, agent._torch.Tensor) and loss.numel() == 1:
                        d.add_loss(loss)
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)
            agent._in_backward = True
            try:
                return original(tensors, *args, **kwargs)
            finally:
                agent._in_backward = False
                if started and agent.active:
                    try:
                        if agent.driver.phase_name == "backward":
                            agent.driver.phase(None)
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

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        try:
            if not self._start():
                return
            if not any(r() is optimizer for r in self._optimizers):
                self._optimizers.append(weakref.ref(optimizer))
                if self._primary is None:
                    self._primary = weakref.ref(optimizer)
                    self._watch(optimizer)
                elif self._states is not None:
                    self._states.add(optimizer)
            self.driver.phase("optimizer")
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        try:
            d = self.driver
            if d is None:
                return
            if d.phase_name == "optimizer":
                d.phase(None)
            if self._primary is not None and self._primary() is optimizer:
                groups = optimizer.param_groups
                if groups and "lr" in groups[0]:
                    d.log(lr=groups[0]["lr"])
                if self._ambiguous:
                    d.samples = d.tokens = 0
                    self._ambiguous = False
                d.end_step()
                d.begin_step()
                self._steps += 1
                if self._steps == NARROW_AFTER and self._roots is not None:
                    self._narrow()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _watch(self, optimizer: Any) -> None:
        root = self._root() if self._root is not None else None
        self._states = _States([optimizer])
        self.monitor.watch(_Params([optimizer], root), self._states)

    # ---- frameworks: hand over to their callbacks ------------------------------------------
    def _callback_target(self) -> tuple[Any, dict[str, Any]]:
        if self.monitor is not None:
            return self.monitor, {}
        return self.run_dir, dict(self.monitor_kwargs)

    def delegate(self, framework: str) -> None:
        """A framework callback records from now on; our hooks step aside."""
        self.delegated_to = framework
        if self.driver is not None:
            self.driver.abandon()
        self.stopped = True
        self.uninstall()

    def attach_hf(self, trainer: Any) -> None:
        if self.stopped:
            return
        from gpudash.integrations.hf import GpudashCallback

        if not any(isinstance(cb, GpudashCallback) for cb in trainer.callback_handler.callbacks):
            target, kwargs = self._callback_target()
            trainer.add_callback(GpudashCallback(target, **kwargs))
        self.delegate("transformers.Trainer")

    def lightning_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.stopped:
            return kwargs
        from gpudash.integrations.lightning import GpudashCallback

        given = kwargs.get("callbacks")
        callbacks = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        if not any(isinstance(cb, GpudashCallback) for cb in callbacks):
            target, monitor_kwargs = self._callback_target()
            callbacks.append(GpudashCallback(target, **monitor_kwargs))
            kwargs = {**kwargs, "callbacks": callbacks}
        self.delegate("lightning.Trainer")
        return kwargs


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
            try:
                options = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
            except ValueError:
                options = {}
            _agent = Agent(run_dir, options)
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


WATCHED = ("torch", "gpudash.monitor", "transformers.trainer", "lightning.pytorch.trainer.trainer")
