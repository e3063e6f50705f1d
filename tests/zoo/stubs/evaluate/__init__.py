"""A local stand-in for Hugging Face ``evaluate`` (not installed here, nothing downloaded): ``load("glue", "mrpc")``
gives the GLUE MRPC metric (accuracy and F1) with ``add_batch`` and ``compute``. Imports ``datasets`` first,
as the real package does."""

from __future__ import annotations

from typing import Any

import datasets  # noqa: F401 - the real evaluate imports it (and so asks where torch is) at import

__all__ = ["load"]


class _Glue:
    def __init__(self) -> None:
        self._pred: list[int] = []
        self._ref: list[int] = []

    def add_batch(self, predictions: Any, references: Any) -> None:
        self._pred += [int(p) for p in predictions]
        self._ref += [int(r) for r in references]

    def compute(self) -> dict[str, float]:
        pairs = list(zip(self._pred, self._ref, strict=True))
        self._pred, self._ref = [], []
        tp = sum(1 for p, r in pairs if p == r == 1)
        fp = sum(1 for p, r in pairs if p == 1 and r == 0)
        fn = sum(1 for p, r in pairs if p == 0 and r == 1)
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        return {"accuracy": sum(p == r for p, r in pairs) / max(len(pairs), 1), "f1": f1}


def load(path: str, config_name: str | None = None, **kwargs: Any) -> _Glue:
    if (path, config_name) != ("glue", "mrpc"):
        raise ValueError(f"this stand-in only has glue/mrpc, not {path}/{config_name}")
    return _Glue()
