"""CPU offload: AdamW whose fp32 master weights and moments live in (pinned)
host memory, with the update computed on the CPU (ZeRO-Offload style).

Per step: gradients go device -> host, the CPU runs AdamW on fp32 master
weights, and the new weights go host -> device. On CUDA the copies run on a
side stream into pinned buffers (``non_blocking``), so they can overlap with
compute; the main stream waits for the side stream only where it must. With
``offload_grads`` each gradient leaves the device as soon as backward has
accumulated it (a post-accumulate-grad hook), so the device never holds all
gradients at once.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OffloadOptimizer"]


class OffloadOptimizer:
    """Wraps ``torch.optim.AdamW`` over host copies of ``params``; acts like an optimizer."""

    def __init__(self, params: list[torch.nn.Parameter], *, lr: float, betas: tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.1, offload_grads: bool = False) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.device = self.params[0].device
        self.cuda = self.device.type == "cuda"
        pin = self.cuda  # pinned memory needs a CUDA context; on CPU plain memory is the host
        self.master = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin) for p in self.params]
        self.host_grads = [torch.zeros(p.shape, dtype=torch.float32, pin_memory=pin) for p in self.params]
        self._staging = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in self.params] \
            if offload_grads and self.cuda else []
        for m, p in zip(self.master, self.params, strict=True):
            m.copy_(p.detach())
            m.requires_grad_(True)
        self.offload_grads = offload_grads
        self.stream: Any = torch.cuda.Stream(self.device) if self.cuda else None
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, betas=betas, weight_decay=weight_decay)
        self._pending = False
        self._hooks: list[Any] = []
        if offload_grads:
            for i, p in enumerate(self.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))

    # ---- the optimizer interface the loop and the Monitor use ------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        for g in self.host_grads:
            g.zero_()

    def state_bytes(self) -> int:
        """Host bytes held: master weights, moments, gradient buffers."""
        tensors = self.master + self.host_grads + self._staging
        tensors += [v for st in self.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ---- gradients -> host -------------------------------------------------------------------
    def _grad_hook(self, i: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            g = p.grad
            assert g is not None
            self._to_host(i, g)
            p.grad = None  # the device copy is free as soon as the side stream is done with it

        return hook

    def _to_host(self, i: int, g: torch.Tensor) -> None:
        if self.stream is None:
            self.host_grads[i].add_(g.detach().float())
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self._staging[i].copy_(g.detach(), non_blocking=True)
            g.record_stream(self.stream)
        self._pending = True
        # accumulate on the CPU once the copy landed (collected in after_backward)

    def after_backward(self) -> None:
        """Finish this micro-batch's gradient copies (offload_grads on CUDA)."""
        if self.stream is not None and self._pending:
            self.stream.synchronize()
            for h, s in zip(self.host_grads, self._staging, strict=True):
                h.add_(s.float())
            self._pending = False

    def unscale_grads_(self, inv_scale: float) -> None:
        for g in self.host_grads:
            g.mul_(inv_scale)

    # ---- the step ----------------------------------------------------------------------------
    def gather_grads(self) -> None:
        """Bring the device gradients over (when they were not offloaded during backward)."""
        if self.offload_grads:
            self.after_backward()
            return
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for h, p in zip(self.host_grads, self.params, strict=True):
                    if p.grad is not None:
                        h.copy_(p.grad.detach(), non_blocking=True)
            self.stream.synchronize()
        else:
            for h, p in zip(self.host_grads, self.params, strict=True):
                if p.grad is not None:
                    h.copy_(p.grad.detach())

    def grad_norm(self) -> torch.Tensor:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in self.host_grads]))

    def clip_(self, max_norm: float) -> torch.Tensor:
        norm = self.grad_norm()
        if max_norm > 0 and torch.isfinite(norm):
            coef = min(1.0, max_norm / (float(norm) + 1e-6))
            if coef < 1.0:
                for g in self.host_grads:
                    g.mul_(coef)
        return norm

    def step(self) -> None:
        """AdamW on the CPU, then the new weights go back to the device."""
        self.cpu_step()
        self.push_params()

    def cpu_step(self) -> None:
        """AdamW over the fp32 master weights, on the CPU."""
        if self.stream is not None:
            self.stream.synchronize()  # last step's host -> device copies read the master weights
        for m, g in zip(self.master, self.host_grads, strict=True):
            m.grad = g
        self.optimizer.step()
        for m in self.master:
            m.grad = None

    def push_params(self) -> None:
        """Copy the updated master weights to the device (side stream on CUDA)."""
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                for p, m in zip(self.params, self.master, strict=True):
                    p.data.copy_(m.detach(), non_blocking=True)
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        else:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    p.copy_(m)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
