"""A local stand-in for Hugging Face ``datasets`` (not installed here, and nothing is downloaded): what the zoo's
accelerate example calls (``load_dataset("nyu-mll/glue", "mrpc")``, ``DatasetDict.map(batched=True,
remove_columns=)``, ``rename_column``, indexing, ``len``, a split's ``split`` name) over a small MRPC-shaped
corpus made here from a fixed seed. Like the real package it asks where torch is at import time
(``importlib.util.find_spec("torch")``, as ``datasets.config`` does) before anything imports torch."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from typing import Any

TORCH_AVAILABLE = importlib.util.find_spec("torch") is not None

__all__ = ["Dataset", "DatasetDict", "load_dataset"]

WORDS = ("the cat dog sat ran on a mat log bank river money said that it was not good bad big small company "
         "shares rose fell percent today yesterday market report new old").split()
SIZES = {"train": 64, "validation": 40, "test": 8}


class Dataset:
    def __init__(self, columns: dict[str, list[Any]], split: str) -> None:
        self._columns = columns
        self.split = split

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return len(next(iter(self._columns.values())))

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {k: v[i] for k, v in self._columns.items()}

    def map(self, fn: Callable[[dict[str, list[Any]]], Any], batched: bool = False,
            remove_columns: list[str] | None = None) -> Dataset:
        if not batched:
            raise NotImplementedError("this stand-in maps batched only")
        added = dict(fn(dict(self._columns)))
        kept = {k: v for k, v in self._columns.items() if k not in (remove_columns or ())}
        return Dataset({**kept, **{k: list(v) for k, v in added.items()}}, self.split)

    def rename_column(self, old: str, new: str) -> Dataset:
        return Dataset({(new if k == old else k): v for k, v in self._columns.items()}, self.split)


class DatasetDict(dict):  # type: ignore[type-arg]
    def map(self, *args: Any, **kwargs: Any) -> DatasetDict:
        return DatasetDict({k: v.map(*args, **kwargs) for k, v in self.items()})

    def rename_column(self, old: str, new: str) -> DatasetDict:
        return DatasetDict({k: v.rename_column(old, new) for k, v in self.items()})


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))) + "."


def load_dataset(path: str, name: str | None = None, **kwargs: Any) -> DatasetDict:
    if (path, name) not in (("nyu-mll/glue", "mrpc"), ("glue", "mrpc")):
        raise ValueError(f"this stand-in only has glue/mrpc, not {path}/{name}")
    rng = random.Random(0)
    out = DatasetDict()
    idx = 0
    for split, n in SIZES.items():
        cols: dict[str, list[Any]] = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
        for _ in range(n):
            cols["sentence1"].append(_sentence(rng))
            cols["sentence2"].append(_sentence(rng))
            cols["label"].append(rng.randint(0, 1))
            cols["idx"].append(idx)
            idx += 1
        out[split] = Dataset(cols, split)
    return out
