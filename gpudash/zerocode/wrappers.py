"""The functions of torch that ``gpudash run``'s agent wraps (see agent.py): each wrapper calls the original
unchanged and tells the agent's session; a failure in here stops recording, never the script."""

from __future__ import annotations

import functools
import weakref
from typing import Any

__all__ = ["backward", "closure", "loader_iter", "optimizer_init", "save", "scale"]


def backward(agent: Any, original: Any) -> Any:
    """``torch.autograd.backward``: the backward phase and the loss passed to it."""

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if not agent.active or agent.in_backward:
            return original(tensors, *args, **kwargs)
        started = False
        try:
            if agent.start_step():
                loss = tensors
                scaled = agent.scaled_loss
                if scaled is not None and scaled[0] is loss:
                    loss = scaled[1]
                agent.scaled_loss = None
                agent.session.before_backward(loss)
                started = True
        except Exception as exc:  # noqa: BLE001
            agent.fail(exc)
        agent.in_backward = True
        try:
            return original(tensors, *args, **kwargs)
        finally:
            agent.in_backward = False
            if started and agent.active:
                try:
                    agent.session.after_backward()
                except Exception as exc:  # noqa: BLE001
                    agent.fail(exc)

    return backward


def scale(agent: Any, original: Any) -> Any:
    """``GradScaler.scale``: remembers the unscaled loss behind the scaled one."""

    def scale(scaler: Any, outputs: Any) -> Any:
        out = original(scaler, outputs)
        if agent.active and out is not outputs:
            agent.scaled_loss = (out, outputs)
        return out

    return scale


def save(agent: Any, original: Any) -> Any:
    """``torch.save``: the checkpoint phase."""

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


def optimizer_init(agent: Any, original: Any) -> Any:
    """``Optimizer.__init__``: which optimizers the script made."""

    def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
        original(optimizer, *args, **kwargs)
        if agent.active:
            try:
                agent.optimizers_made.add(optimizer)
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)

    return __init__


def closure(agent: Any, closure: Any) -> Any:
    """A step's closure: its first call is the step's loss, the later ones re-evaluate it."""

    @functools.wraps(closure)
    def counted(*args: Any, **kwargs: Any) -> Any:
        if agent.active and agent.session is not None:
            try:
                agent.session.closure_call()
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)
        return closure(*args, **kwargs)

    return counted


def loader_iter(agent: Any, original: Any) -> Any:
    """``DataLoader.__iter__``: which loader an evaluation's batches come from (its split)."""

    def __iter__(loader: Any) -> Any:
        if agent.active:
            try:
                if agent.session is not None:
                    agent.session.loader_iter(loader)
                else:  # recording starts with the first forward: it learns of this loader then
                    agent.first_loader = weakref.ref(loader)
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)
        return original(loader)

    return __iter__
