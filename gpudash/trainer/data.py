"""Data that needs no download: bytes of the Python standard library's own
source files, plus generated variable-length samples, in length buckets.

Bucketing rules (so padding stays small without sorting the whole set):
a batch never mixes samples whose lengths differ by more than 30 %
(buckets are ``[e, 1.3 e)``), and :func:`micro_batches` splits any padded
micro-batch that would waste more than 15 % of its tokens on padding.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["MAX_LENGTH_RATIO", "MAX_PADDING", "ByteTokenizer", "LengthBuckets", "MicroBatch", "corpus_samples",
           "micro_batches", "padding_fraction"]

MAX_LENGTH_RATIO = 1.3
MAX_PADDING = 0.15
_STDLIB_FILES = ("textwrap.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py", "queue.py", "this.py",
                 "colorsys.py", "shlex.py", "glob.py", "keyword.py", "graphlib.py")


class ByteTokenizer:
    """UTF-8 bytes are the tokens (vocab 256): nothing to download or train."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def _stdlib_text() -> str:
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in _STDLIB_FILES:
        try:
            parts.append((lib / name).read_text(encoding="utf-8"))
        except OSError:
            continue
    return "\n".join(parts)


def _generated(rng: random.Random) -> str:
    """Arithmetic lines: learnable structure whose length varies a lot."""
    terms = [str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(2, 8))]
    return "+".join(terms) + "=" + str(sum(int(t) for t in terms)) + "\n"


def corpus_samples(n: int, *, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    """``n`` token sequences with lengths in [min_len, max_len] (+1 for the shifted target),
    half cut from standard-library source text, half generated."""
    if not 2 <= min_len <= max_len:
        raise ValueError(f"need 2 <= min_len <= max_len, got {min_len}, {max_len}")
    rng = random.Random(seed)
    tok = ByteTokenizer()
    text = tok.encode(_stdlib_text()) or tok.encode("".join(_generated(rng) for _ in range(2000)))
    out: list[list[int]] = []
    for i in range(n):
        length = rng.randint(min_len, max_len) + 1
        if i % 2 == 0:
            start = rng.randrange(0, max(1, len(text) - length))
            sample = text[start:start + length]
        else:
            sample = []
            while len(sample) < length:
                sample += tok.encode(_generated(rng))
            sample = sample[:length]
        out.append(sample)
    return out


def bucket_edges(min_len: int, max_len: int, ratio: float = MAX_LENGTH_RATIO) -> list[int]:
    """Edges e0 < e1 < ... with e_{i+1} <= ratio * e_i: a bucket [e_i, e_{i+1}) spans < 30 %."""
    edges = [min_len]
    while edges[-1] <= max_len:
        edges.append(max(edges[-1] + 1, int(edges[-1] * ratio)))
    return edges


class LengthBuckets:
    """An endless, seeded stream of batches; each batch comes from one length bucket."""

    def __init__(self, samples: list[list[int]], batch_size: int, *, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if not samples:
            raise ValueError("no samples")
        self.batch_size = batch_size
        self.rng = random.Random(seed)
        lengths = [len(s) for s in samples]
        edges = bucket_edges(min(lengths), max(lengths))
        buckets: dict[int, list[list[int]]] = {}
        for s in samples:
            i = next(j for j in range(len(edges) - 1) if edges[j] <= len(s) < edges[j + 1])
            buckets.setdefault(i, []).append(s)
        self.buckets = [b for _, b in sorted(buckets.items())]
        self.weights = [len(b) for b in self.buckets]

    def __iter__(self) -> Iterator[list[list[int]]]:
        return self

    def __next__(self) -> list[list[int]]:
        bucket = self.rng.choices(self.buckets, weights=self.weights)[0]
        return [bucket[self.rng.randrange(len(bucket))] for _ in range(self.batch_size)]


def padding_fraction(lengths: Sequence[int]) -> float:
    if not lengths:
        return 0.0
    return 1.0 - sum(lengths) / (len(lengths) * max(lengths))


@dataclass(slots=True)
class MicroBatch:
    x: torch.Tensor  # (B, T) input ids
    y: torch.Tensor  # (B, T) targets, -1 on padding
    tokens: int  # real (unpadded) target tokens

    @property
    def size(self) -> int:
        return int(self.x.shape[0])


def _split(group: list[list[int]], max_padding: float) -> list[list[list[int]]]:
    if len(group) < 2 or padding_fraction([len(s) for s in group]) <= max_padding:
        return [group]
    # sorted longest first: cutting where the length drops most removes the most padding
    drops = [len(group[i - 1]) - len(group[i]) for i in range(1, len(group))]
    cut = 1 + max(range(len(drops)), key=drops.__getitem__)
    return _split(group[:cut], max_padding) + _split(group[cut:], max_padding)


def micro_batches(samples: list[list[int]], micro: int, *, device: torch.device | str = "cpu",
                  max_padding: float = MAX_PADDING) -> list[MicroBatch]:
    """Cut one step's samples into padded micro-batches of at most ``micro`` rows,
    splitting any whose padding would exceed ``max_padding``. Every sample is used once."""
    if micro < 1:
        raise ValueError("micro-batch must be >= 1")
    order = sorted(samples, key=len, reverse=True)
    groups: list[list[list[int]]] = []
    for i in range(0, len(order), micro):
        groups.extend(_split(order[i:i + micro], max_padding))
    out = []
    for g in groups:
        T = max(len(s) for s in g) - 1
        x = torch.zeros((len(g), T), dtype=torch.long)
        y = torch.full((len(g), T), -1, dtype=torch.long)
        for r, s in enumerate(g):
            t = torch.tensor(s, dtype=torch.long)
            x[r, :len(s) - 1] = t[:-1]
            y[r, :len(s) - 1] = t[1:]
        out.append(MicroBatch(x.to(device, non_blocking=True), y.to(device, non_blocking=True),
                              sum(len(s) - 1 for s in g)))
    return out
