"""Evaluations and generation under ``gpudash run``: what runs between training steps under ``no_grad`` or in
eval mode.

- An evaluation is the root module calls from the end of one training step's work to the next training
  forward (or the script's end). The losses those calls return (:func:`loss_of`: ``.loss``, a 0-d tensor,
  nanoGPT's ``(logits, loss)``) become ``evaluation`` events. The event's ``step`` is the last step done
  before it (``k`` for an evaluation between steps ``k`` and ``k+1``: the weights it evaluated); its data says
  ``after_steps`` (``k + 1``; 0 for an evaluation of the initial weights, recorded at step 0). Its time is the
  ``eval`` phase of the *next* step's row (a step runs from the end of one step to the end of the next).
- Splits: batches drawn from different ``DataLoader`` s in one evaluation are kept apart: one event per
  loader, each with its ``split`` (the dataset's ``split`` attribute as Hugging Face ``datasets`` set it, a
  torchvision-style ``train`` flag, else ``eval1``, ``eval2``, ... in the order the loaders were first met)
  and its own ``eval_loss``. Without loaders (nanoGPT's ``get_batch``) ``MonitorOptions.eval_splits`` names
  equal consecutive groups of batches instead (:func:`eval_metrics`).
- Generation: eval calls that return no loss and feed the root module its own previous input grown by one
  token (autoregressive sampling, nanoGPT's ``generate``), or a single new token after a longer prompt (a
  key/value cache, Hugging Face's ``generate``), are the ``generate`` phase, not an evaluation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Evaluations", "eval_metrics", "loss_of", "mean_loss", "split_name"]


def loss_of(output: Any, tensor_type: Any) -> Any:
    """The loss in a module call's output: ``output.loss`` / ``output["loss"]`` (HF), a 0-d floating tensor
    (the output itself, or an element of a short tuple: nanoGPT's ``(logits, loss)``); else None."""

    def scalar(t: Any) -> bool:
        return isinstance(t, tensor_type) and t.ndim == 0 and t.is_floating_point()

    if scalar(output):
        return output
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if scalar(loss):
        return loss
    if isinstance(output, (tuple, list)) and len(output) <= 4:
        return next((t for t in output if scalar(t)), None)
    return None


def mean_loss(losses: list[Any]) -> float | None:
    """The mean of one evaluation's losses (read here: evaluation already waited for the device)."""
    vals = [float(t.detach().float().item()) for t in losses]
    return sum(vals) / len(vals) if vals else None


def eval_metrics(losses: list[Any], splits: tuple[str, ...] = ()) -> dict[str, Any]:
    """One evaluation's numbers: ``eval_loss`` (the mean of every batch's loss) and ``eval_batches``; with
    ``splits`` (MonitorOptions.eval_splits) and batches that fall into that many equal consecutive groups,
    ``eval_loss_<name>`` per group, in order (nanoGPT's estimate_loss: its train batches, then its val
    batches). Batches that do not split evenly say so in ``eval_splits`` (text) instead of guessing."""
    mean = mean_loss(losses)
    if mean is None:
        return {}
    out: dict[str, Any] = {"eval_loss": mean, "eval_batches": len(losses)}
    k = len(splits)
    if k and len(losses) % k == 0:
        size = len(losses) // k
        for i, name in enumerate(splits):
            out[f"eval_loss_{name}"] = mean_loss(losses[i * size:(i + 1) * size])
    elif k:
        out["eval_splits"] = f"{len(losses)} batches do not split into {k} equal groups ({','.join(splits)})"
    return out


def split_name(loader: Any, order: int) -> str:
    """A loader's split: its dataset's ``split`` (HF datasets), a ``train`` flag (torchvision), else ``eval<n>``."""
    dataset = getattr(loader, "dataset", None)
    split = getattr(dataset, "split", None)
    if split is not None and not callable(split) and str(split):
        return str(split)[:40]
    train = getattr(dataset, "train", None)
    if isinstance(train, bool):
        return "train" if train else "test"
    return f"eval{order}"


def _grows(before: Any, now: Any, generating: bool) -> bool:
    """``now`` continues ``before`` autoregressively: one token longer, or one token after a longer prompt
    (or after another single token, once generating: a key/value cache)."""
    b, n = getattr(before, "shape", None), getattr(now, "shape", None)
    if not b or not n or len(b) != len(n) or tuple(b[:-1]) != tuple(n[:-1]):
        return False
    return int(n[-1]) == int(b[-1]) + 1 or (int(n[-1]) == 1 and (int(b[-1]) > 1 or generating))


def _input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("input_ids")


class Evaluations:
    """The open evaluation (or generation) of one process under ``gpudash run``; the Session drives it."""

    def __init__(self, monitor: Any, driver: Any, tensor_type: Any) -> None:
        self.monitor = monitor
        self.driver = driver
        self.tensor_type = tensor_type
        self.open = False
        self.count = 0  # evaluations recorded (with a loss)
        self.passes = 0  # eval-mode / no_grad stretches between steps, with a loss or not
        self.generations = 0
        self._groups: list[tuple[Any, list[Any]]] = []  # (loader key or None, losses), in order
        self._loader: Any = None  # the loader whose iterator was made last
        self._names: dict[int, str] = {}  # id(loader) -> split name
        self._last_input: Any = None
        self._generating = False

    # ---- what the agent sees ------------------------------------------------------------------
    def loader_iter(self, loader: Any) -> None:
        """A DataLoader starts an iteration (an epoch, or an evaluation pass over it)."""
        key = id(loader)
        if key not in self._names:
            self._names[key] = split_name(loader, sum(1 for n in self._names.values() if n.startswith("eval")) + 1)
        self._loader = key

    def training(self) -> None:
        """A training forward: the loader iterated last is the training data, not an evaluation's."""
        self._loader = None

    def forward(self) -> None:
        """An eval-mode / no_grad root call starts: in the phase the last one ended in."""
        self.open = True
        want = "generate" if self._generating else "eval"
        if self.driver.phase_name != want:
            self.driver.phase(want)

    def output(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """It returned: its loss counts; an input that continues the last one's means generation."""
        x = _input(args, kwargs)
        loss = loss_of(output, self.tensor_type)
        generating = loss is None and self._last_input is not None and _grows(self._last_input, x, self._generating)
        self._last_input = _Shape(x.shape) if hasattr(x, "shape") else None
        if generating != self._generating:
            self.generations += generating
            self._generating = generating
            self.driver.phase("generate" if generating else "eval")
        if loss is None:
            return
        key = self._loader
        if not self._groups or self._groups[-1][0] != key:
            self._groups.append((key, []))
        self._groups[-1][1].append(loss.detach())

    # ---- the end of it ------------------------------------------------------------------------
    def end(self, after_steps: int) -> None:
        """Training resumed (or the script ended): record the evaluation of the weights after ``after_steps``
        optimizer steps."""
        if not self.open:
            return
        self.open = False
        self.passes += 1
        self._last_input = None
        self._generating = False
        groups, self._groups = self._groups, []
        if self.driver.phase_name in ("eval", "generate"):
            self.driver.phase(None)
        merged: dict[Any, list[Any]] = {}
        for key, losses in groups:
            merged.setdefault(key, []).extend(losses)
        if not merged:
            return
        self.count += 1
        named = [(self._names.get(key) if key is not None else None, losses) for key, losses in merged.items()]
        if len(named) == 1 and named[0][0] is None:
            self._record(after_steps, None, named[0][1], self.monitor.options.eval_splits)
            return
        for name, losses in named:
            self._record(after_steps, name or "eval", losses, ())

    def _record(self, after: int, split: str | None, losses: list[Any], splits: tuple[str, ...]) -> None:
        m = self.monitor
        if m.closed:
            return
        metrics = eval_metrics(losses, splits)
        uneven = metrics.pop("eval_splits", None)
        if uneven:  # said once, in the run's meta and events; eval_loss is still recorded
            m.unavailable("eval_splits", uneven)
        step = max(after - 1, 0)
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        where = f"the weights after step {after - 1}" if after else "the initial weights"
        data: dict[str, Any] = {"metrics": metrics, "after_steps": after}
        if split is not None:
            data["split"] = split
        label = f"evaluation ({split})" if split else "evaluation"
        m.recorder.put("events", {"time": _now(), "step": step, "kind": "evaluation",
                                  "message": f"{label} of {where}: {shown}", "data": data})


class _Shape(tuple):  # type: ignore[type-arg]
    """A remembered input's shape, without keeping the tensor alive."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self)


def _now() -> float:
    import time

    return time.time()
