"""How ``gpudash run`` counts a training forward's samples and tokens, from the root module's inputs.

Shapes only (never the data: no GPU sync), in this order:

- the input: the first positional argument; without one (``model(**batch)``) ``input_ids``, else
  ``inputs_embeds``, ``pixel_values``, ``input_values``, ``x``, ``input``, else the first tensor keyword.
  A dict passed positionally (``model(batch)``) is read the same way.
- a ``PackedSequence``: its sequences (``batch_sizes[0]``) and their tokens (the packed length).
- a list or tuple of tensors (torchvision's detection models, variable-length sequences): one sample per
  element; tokens when they are all 1-D integer tensors (their lengths).
- a tensor: its first dimension is the batch (its second for an RNN/LSTM/GRU without ``batch_first``), unless the input is *unbatched*, i.e. shaped the way the
  first layer with weights takes one sample: ``nn.Linear`` and a 1-D input of ``in_features``, a
  convolution and an input of ``in_channels`` and one dimension less than a batch, an RNN/LSTM/GRU and a
  2-D ``(length, input_size)`` input, ``nn.Embedding`` and a 1-D integer input (one sequence), or a 0-d
  input: then 1 sample. An actor-critic loop feeding one state of shape ``(4,)`` counts 1, not 4.
- tokens: an integer input of 2 dimensions (``(batch, length)``) counts ``batch * length``, padding
  included (as ``Trainer``'s ``num_input_tokens_seen`` counts by default; reading ``attention_mask``'s
  sum would wait for the GPU); a 1-D integer sequence counts its length. Without ``input_ids`` a
  2-D ``attention_mask`` stands for them. Sequences packed into a row (``position_ids`` that restart at
  0 for each, as Hugging Face's packing collators make) count one sample per restart when
  ``position_ids`` is on the CPU, else the rows.
- None (the step's samples left empty) when tensor arguments disagree on the batch dimension.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["samples_tokens", "unbatched"]

_INPUT_KEYS = ("input_ids", "inputs_embeds", "pixel_values", "input_values", "x", "input")


def _is_int(t: Any) -> bool:
    return not t.is_floating_point() and not t.is_complex()


_FIRST: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # root -> its first layer with weights


def _first_layer(module: Any) -> Any:
    """The first submodule (in registration order) that holds weights of its own (looked up once per root)."""
    try:
        return _FIRST[module]
    except (KeyError, TypeError):
        pass
    layer = next((m for m in module.modules() if any(True for _ in m.parameters(recurse=False))), None)
    try:
        _FIRST[module] = layer
    except TypeError:
        pass
    return layer


def unbatched(module: Any, x: Any) -> bool:
    """Whether tensor ``x`` is one sample, as the first layer of ``module`` with weights reads it."""
    if x.ndim == 0:
        return True
    layer = _first_layer(module)
    if layer is None:
        return False
    in_features = getattr(layer, "in_features", None)
    if isinstance(in_features, int):
        return x.ndim == 1 and x.shape[-1] == in_features
    in_channels = getattr(layer, "in_channels", None)
    kernel = getattr(layer, "kernel_size", None)
    if isinstance(in_channels, int) and isinstance(kernel, tuple):
        return x.ndim == len(kernel) + 1 and x.shape[0] == in_channels
    input_size = getattr(layer, "input_size", None)
    if isinstance(input_size, int) and hasattr(layer, "batch_first"):
        return x.ndim == 2 and x.shape[-1] == input_size
    if hasattr(layer, "num_embeddings") and hasattr(layer, "embedding_dim"):
        return x.ndim == 1 and _is_int(x)
    return False


def _packed_rows(position_ids: Any) -> int | None:
    """Sequences packed into rows: the restarts of ``position_ids`` at 0 (CPU only: no GPU sync)."""
    if getattr(position_ids, "device", None) is None or position_ids.device.type != "cpu" or position_ids.ndim != 2:
        return None
    return int((position_ids == 0).sum())


def _from_mapping(batch: Any) -> tuple[int | None, int | None]:
    x = next((batch[k] for k in _INPUT_KEYS if hasattr(batch.get(k), "shape")), None)
    mask = batch.get("attention_mask")
    if x is None:
        x = mask if hasattr(mask, "shape") else next((v for v in batch.values() if hasattr(v, "shape")), None)
    shape = getattr(x, "shape", None)
    if not shape:
        return None, None
    samples = int(shape[0])
    ids = batch.get("input_ids")
    if not hasattr(ids, "shape") and hasattr(mask, "shape") and mask.ndim == 2:
        ids = mask
    tokens = int(ids.numel()) if hasattr(ids, "shape") and ids.ndim == 2 else None
    if samples == 1 and "position_ids" in batch:
        samples = _packed_rows(batch["position_ids"]) or samples
    return samples, tokens


def samples_tokens(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(samples, tokens) of one training forward of the root ``module``; None when ambiguous."""
    kwargs = kwargs or {}
    first: Any = args[0] if args else None
    if first is None and kwargs:
        return _from_mapping(kwargs)
    if isinstance(first, dict):
        return _from_mapping(first)
    if hasattr(first, "batch_sizes") and hasattr(first, "data"):  # PackedSequence
        return int(first.batch_sizes[0]), int(first.data.shape[0])
    if isinstance(first, (list, tuple)) and first and all(hasattr(t, "shape") for t in first):
        ints = all(t.ndim == 1 and _is_int(t) for t in first)
        return len(first), (sum(int(t.shape[0]) for t in first) if ints else None)
    shape = getattr(first, "shape", None)
    if shape is None:
        return None, None
    if unbatched(module, first):
        tokens = int(shape[0]) if first.ndim == 1 and _is_int(first) else None
        return 1, tokens
    n = int(shape[0])
    layer = _first_layer(module)
    if first.ndim == 3 and hasattr(layer, "batch_first") and not layer.batch_first:
        return int(shape[1]), None  # an RNN/LSTM/GRU reads (length, batch, features)
    for a in args[1:]:
        s = getattr(a, "shape", None)
        if s and int(s[0]) != n:
            return None, None  # tensors disagree on the batch dimension
    tokens = n * int(shape[1]) if len(shape) == 2 and _is_int(first) else None
    if n == 1 and "position_ids" in kwargs:
        n = _packed_rows(kwargs["position_ids"]) or n
    return n, tokens
