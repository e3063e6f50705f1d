"""Activations of one measured step: what autograd saves, by watched module, with nothing left on the user's objects.

On a measured step two things are installed, process-wide, and removed when the step ends:

- ``torch.autograd.graph.saved_tensors_hooks``: the pack hook sees every tensor autograd saves for backward
  and notes its storage (address, bytes) against the innermost watched module running (parameter storages
  excluded). It keeps no tensor. It hands autograd ``tensor.detach()``, never the tensor itself: a saved
  *output* handed back as itself is a reference cycle (its ``grad_fn`` owns the saved variable, which would
  own the tensor, which owns the ``grad_fn``), one that ``gc`` cannot see, so a graph kept by
  ``backward(retain_graph=True)`` or ``autograd.grad(create_graph=True)`` was never freed. PyTorch itself saves
  outputs without their ``grad_fn`` for this reason; on unpacking it restores the ``grad_fn`` (and a leaf's
  gradient accumulator) from what it noted at saving, so the detached tensor loses nothing: double backward,
  checkpointing and autocast run as bare.
- global module forward pre-hook and hook (``torch.nn.modules.module.register_module_forward_pre_hook``),
  which keep the stack of watched modules running: a call counts when the module *is* one of the watched
  model's modules (by identity). No hook is ever put on a module, so a model pickled (``torch.save(model)``),
  deep-copied (EMA, teacher), scripted or exported during a measured step carries nothing of gpudash's, and a
  copy runs without feeding it. While ``torch.compile``/``torch.export`` traces, the hooks do nothing (they
  would be traced into the user's graph).

Between measured steps none of this is installed: module calls take torch's no-hook fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["OUTSIDE", "ActivationProbe", "storage_of"]

OUTSIDE = "(outside modules)"


def storage_of(t: Any) -> tuple[int, int] | None:
    """(address, bytes) of ``t``'s storage; None for sparse, meta or other tensors without one."""
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except Exception:  # noqa: BLE001 - sparse, meta, or exotic tensors: skip them
        return None


def _unpack(t: Any) -> Any:
    # module-level and stateless: each saved variable of a measured step's graph holds this function
    return t


class ActivationProbe:
    """The hooks of measured steps and what they saw: per cycle (forward/backward), the bytes and tensors
    saved per watched module, each storage once."""

    def __init__(self, torch: Any, in_backward: Callable[[], bool]) -> None:
        self._torch = torch
        self._in_backward = in_backward
        self._modules: dict[int, tuple[Any, str]] = {}  # id(module) -> (module, name): identity, not equality
        self.param_ptrs: set[int] = set()
        self.stack: list[str] = []
        self.seen: dict[int, tuple[str, int]] = {}  # storage address -> (owner, bytes): no tensor kept
        self.counts: dict[str, int] = {}
        self._handles: list[Any] = []
        self._ctx: Any = None
        # torch.compiler.is_compiling from torch 2.3; torch._utils.is_compiling before it
        self._compiling: Callable[[], bool] = (getattr(getattr(torch, "compiler", None), "is_compiling", None)
                                               or getattr(getattr(torch, "_utils", None), "is_compiling", None)
                                               or (lambda: False))
        # one bound method each, made once: a hook is the same object on every measured step
        self._enter_hook = self._enter
        self._leave_hook = self._leave
        self._pack_hook = self._pack

    @property
    def installed(self) -> bool:
        return self._ctx is not None

    def watch(self, modules: list[tuple[str, Any]], param_ptrs: set[int]) -> None:
        self._modules = {id(m): (m, name) for name, m in modules}
        self.param_ptrs = param_ptrs

    # ---- hooks (training thread) ------------------------------------------------------------
    def _enter(self, module: Any, args: Any) -> None:
        hit = self._modules.get(id(module))
        if hit is not None and hit[0] is module and not self._compiling():
            self.stack.append(hit[1])

    def _leave(self, module: Any, args: Any, output: Any) -> None:
        hit = self._modules.get(id(module))
        if hit is not None and hit[0] is module and self.stack and not self._compiling():
            self.stack.pop()

    def _pack(self, t: Any) -> Any:
        if not self._in_backward():
            s = storage_of(t)
            seen = self.seen
            if s is not None and s[0] not in self.param_ptrs and s[0] not in seen:
                stack = self.stack
                owner = stack[-1] if stack else OUTSIDE
                seen[s[0]] = (owner, s[1])
                self.counts[owner] = self.counts.get(owner, 0) + 1
        out = t
        if t.requires_grad:
            try:
                out = t.detach()  # the storage only: autograd restores grad_fn / accumulator on unpack
            except Exception:  # noqa: BLE001 - a subclass that cannot detach is saved as it is
                out = t
        return out

    # ---- installing ---------------------------------------------------------------------------
    def install(self) -> None:
        """Start measuring (the step's first cycle); a no-op when installed."""
        if self._ctx is not None:
            return
        self.seen.clear()
        self.counts.clear()
        self.stack.clear()
        nn_module = self._torch.nn.modules.module
        try:
            self._handles = [nn_module.register_module_forward_pre_hook(self._enter_hook),
                             nn_module.register_module_forward_hook(self._leave_hook, always_call=True)]
            ctx = self._torch.autograd.graph.saved_tensors_hooks(self._pack_hook, _unpack)
            ctx.__enter__()
        except BaseException:
            self._remove_module_hooks()
            raise
        self._ctx = ctx

    def uninstall(self) -> None:
        self._remove_module_hooks()
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            try:
                ctx.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - hooks popped by someone else: nothing to undo
                pass
        self.stack.clear()

    def _remove_module_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def take_cycle(self) -> tuple[dict[str, int], dict[str, int]]:
        """(bytes, tensors) per owner of the cycle that just ended; the next cycle starts empty."""
        per: dict[str, int] = {}
        for owner, nbytes in self.seen.values():
            per[owner] = per.get(owner, 0) + nbytes
        counts = dict(self.counts)
        self.seen.clear()
        self.counts.clear()
        return per, counts
