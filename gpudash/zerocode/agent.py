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
  ``forward`` phase, and samples and tokens from the inputs of the root module
  that has parameters (``inputs.py``: unbatched, packed, dict and list inputs).
  Under ``no_grad`` / ``inference_mode`` or in eval mode: the ``eval`` phase
  (or ``generate``), open until training resumes; the losses those calls
  return are ``evaluation`` events at the step whose weights they evaluated,
  one per ``DataLoader`` (``evals.py``). After the first ``NARROW_AFTER`` steps the global
  forward hooks are replaced by a wrapper of each root module's call seen, so
  other module calls cost nothing (a root first called later is not timed).
  The wrapper is the slot ``nn.Module.compile()`` uses (``_compiled_call_impl``),
  which ``nn.Module`` leaves out of its pickled and deep-copied state: no hook
  is put on a module, so a model saved (``torch.save(model)``), deep-copied
  (an EMA or teacher copy, which then runs unrecorded), scripted or exported
  carries nothing of gpudash's. A torch without that slot keeps the global
  hooks.
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

from gpudash.zerocode import outcome, wrappers

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


def _call_slot_is_private(torch: Any) -> bool:
    """Whether ``nn.Module`` calls through ``_compiled_call_impl`` and leaves it out of pickles and copies."""
    try:
        probe = torch.nn.Module()
        probe._compiled_call_impl = None
        return ("_compiled_call_impl" not in probe.__getstate__()
                and callable(getattr(getattr(torch, "compiler", None), "is_compiling", None)))
    except Exception:  # noqa: BLE001 - any doubt: keep the global hooks
        return False


class _RootCall:
    """A root module's call under the agent's forward hooks, kept in ``module._compiled_call_impl``
    (chaining what ``module.compile()`` put there). Removable like a hook handle."""

    __slots__ = ("agent", "inner", "module")

    def __init__(self, agent: Agent, module: Any) -> None:
        self.agent = agent
        self.module = weakref.ref(module)
        self.inner = module.__dict__.get("_compiled_call_impl")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module()
        inner = self.inner
        if module is None:  # cannot happen while the module calls it; kept for type checkers
            return inner(*args, **kwargs)
        if inner is None:
            inner = module._call_impl
        agent = self.agent
        if agent._torch.compiler.is_compiling():
            return inner(*args, **kwargs)
        agent._forward_pre(module, args)
        out = None
        try:
            out = inner(*args, **kwargs)
        finally:
            agent._forward_post(module, args, kwargs, out)
        return out

    def remove(self) -> None:
        module = self.module()
        if module is None or module.__dict__.get("_compiled_call_impl") is not self:
            return  # gone, or the script compiled the module since: its call stays as it made it
        if self.inner is None:
            del module._compiled_call_impl
        else:
            module._compiled_call_impl = self.inner


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
        self.failure: str | None = None  # why recording failed, when it did
        self.first_loader: Any = None  # weakref: the DataLoader iterated last before recording started
        self._torch: Any = None
        self._handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []
        self._creating = False
        self._depth = 0
        self._call = ""  # the root call in progress: "train", "eval" or "" (not recorded)
        self.in_backward = False
        self.scaled_loss: tuple[Any, Any] | None = None  # (scaled loss, loss) from GradScaler.scale
        self._roots: weakref.WeakSet[Any] | None = weakref.WeakSet()  # None once narrowed
        self._global_forward: list[Any] = []
        self.optimizers_made: weakref.WeakSet[Any] = weakref.WeakSet()  # every torch.optim optimizer made

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
            nn_module.register_module_forward_hook(self._forward_post, with_kwargs=True, always_call=True),
        ]
        self._handles = [
            *self._global_forward,
            optim_module.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_module.register_optimizer_step_post_hook(self._optimizer_post),
        ]
        self._wrap(optim_module.Optimizer, "__init__", wrappers.optimizer_init)
        self._wrap(torch.autograd, "backward", wrappers.backward)
        self._wrap(torch, "save", wrappers.save)
        loader = getattr(getattr(getattr(torch, "utils", None), "data", None), "DataLoader", None)
        if loader is not None:
            self._wrap(loader, "__iter__", wrappers.loader_iter)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._wrap(scaler, "scale", wrappers.scale)
        self.active = True
        outcome.report(torch=True)
        atexit.register(self._report)  # before the Monitor's: runs after it closed

    def _narrow(self) -> None:
        """Replace the global forward hooks by a wrapper of each root module's call seen."""
        if not _call_slot_is_private(self._torch):
            return  # an older torch: calls not wrappable without riding on the module; the global hooks stay
        roots, self._roots = list(self._roots or ()), None
        for h in self._global_forward:
            h.remove()
            self._handles.remove(h)
        self._global_forward = []
        for module in roots:
            call = _RootCall(self, module)
            module._compiled_call_impl = call
            self._handles.append(call)

    def _stepped(self) -> None:
        if self.session.steps == NARROW_AFTER and self._roots is not None:
            self._narrow()

    def _wrap(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, functools.wraps(original)(make(self, original)))
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
        self.failure = f"gpudash's hooks failed ({type(exc).__name__}: {exc})"
        if self.session is not None:
            self.session.failure = self.failure
        self.stop("finished", f"gpudash stopped recording: {type(exc).__name__}: {exc}")

    def _report(self) -> None:
        """At exit: what this process recorded, for the job's last word (outcome.py)."""
        m, s = self.monitor, self.session
        outcome.report(torch=True, steps=0 if m is None else m.step_index, delegated=self.delegated_to,
                       failed=self.failure, no_steps=None if s is None else s.no_steps, written=m is not None)

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
    def start_step(self) -> bool:
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
            self.failure = f"cannot record into {self.run_dir} ({type(exc).__name__}: {exc})"
            self.stop()
            return False
        finally:
            self._creating = False
        self.monitor = monitor
        resume_from_optimizers(monitor, self.optimizers_made)  # a script resumed from its checkpoint
        # Python processes this one starts from now on (data workers, a script it runs) would
        # record as the same rank into the same files: they run unrecorded
        os.environ.pop(ENV_RUN_DIR, None)
        atexit.register(self.at_exit)  # after the Monitor's own: runs first
        self.session = Session(monitor, self._torch)
        self.session.constructed = self.optimizers_made
        loader = self.first_loader() if self.first_loader is not None else None
        if loader is not None:
            self.session.loader_iter(loader)
        self.first_loader = None
        return True

    def foreign_monitor(self, monitor: Any) -> None:
        """Someone else opened a Monitor in this process (the script, or a callback)."""
        if self._creating or monitor is self.monitor or self.stopped:
            return
        if self.monitor is None:
            self.delegated_to = "the script's own gpudash.Monitor"  # the job's last word leaves the run to it
            outcome.report(torch=self._torch is not None, delegated=self.delegated_to)
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
                if not self.start_step():
                    return
            if self._roots is not None:
                self._roots.add(module)
            if training:
                self._call = "train"
                self.session.train_forward(module)
            else:
                self._call = "eval"
                self.session.eval_forward()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _forward_post(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        depth = self._depth - 1
        self._depth = depth if depth > 0 else 0
        if depth > 0 or not self._call or not self.active:
            return
        try:
            if self._call == "eval":
                self.session.eval_output(args, kwargs, output)
            else:
                self.session.train_forward_done(module, args, kwargs)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """The step's closure, when it has one, comes back wrapped: its first call is the step's loss."""
        if not self.active:
            return None
        try:
            if self.start_step() and self.session.optimizer_pre(optimizer):
                if args and callable(args[0]):
                    return (wrappers.closure(self, args[0]), *args[1:]), kwargs
                if callable(kwargs.get("closure")):
                    return args, {**kwargs, "closure": wrappers.closure(self, kwargs["closure"])}
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        return None

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
