"""``gpudash run`` and the frameworks that have a gpudash callback: HF ``Trainer`` and Lightning ``Trainer``
get the callback added when they are built, and the agent's own hooks step aside."""

from __future__ import annotations

from typing import Any

__all__ = ["attach_hf", "lightning_kwargs"]


def _target(agent: Any) -> tuple[Any, dict[str, Any]]:
    if agent.monitor is not None:
        return agent.monitor, {}
    return agent.run_dir, dict(agent.monitor_kwargs)


def attach_hf(agent: Any, trainer: Any) -> None:
    if agent.stopped:
        return
    from gpudash.integrations.hf import GpudashCallback

    if not any(isinstance(cb, GpudashCallback) for cb in trainer.callback_handler.callbacks):
        target, kwargs = _target(agent)
        trainer.add_callback(GpudashCallback(target, **kwargs))
    agent.delegate("transformers.Trainer")


def lightning_kwargs(agent: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    if agent.stopped:
        return kwargs
    from gpudash.integrations.lightning import GpudashCallback

    given = kwargs.get("callbacks")
    callbacks = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
    if not any(isinstance(cb, GpudashCallback) for cb in callbacks):
        target, monitor_kwargs = _target(agent)
        callbacks.append(GpudashCallback(target, **monitor_kwargs))
        kwargs = {**kwargs, "callbacks": callbacks}
    agent.delegate("lightning.Trainer")
    return kwargs
