"""nanoGPT's one runner, shared by ``tests/zoo/test_nanogpt.py`` and ``benchmarks/step_cost.py``.

:func:`prepare` copies nanoGPT's files (vendored unchanged in ``tests/zoo/nanogpt/``) into a work folder and makes a
character-level dataset from local text, as its ``data/shakespeare_char/prepare.py`` does (no download);
:func:`command` is ``train.py`` with nanoGPT's own configurator arguments (``--key=value``); :func:`iterations`
reads the ``iter N: loss L, time T ms`` lines nanoGPT prints. Plain Python (no pytest): tests import it as
``helpers.nanogpt``, the benchmark with ``tests/`` on its path.
"""

from __future__ import annotations

import pickle
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "tests" / "zoo" / "nanogpt"
ITER = re.compile(r"^iter (\d+): loss (\S+), time ([\d.]+)ms", re.M)


def prepare(work: Path) -> int:
    """nanoGPT's files and the ``tiny`` dataset in ``work``; returns the vocabulary size."""
    import numpy as np

    for f in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / f, work / f)
    text = (ROOT / "README.md").read_text() + (NANOGPT / "LICENSE").read_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    data = work / "data" / "tiny"
    data.mkdir(parents=True)
    n = int(0.9 * len(ids))
    ids[:n].tofile(data / "train.bin")
    ids[n:].tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return len(chars)


def command(config: dict[str, Any]) -> list[str]:
    """``python train.py --key=value ...`` (run it in the work folder)."""
    return [sys.executable, "train.py", *[f"--{k}={v}" for k, v in config.items()]]


def iterations(stdout: str) -> list[tuple[int, float, float]]:
    """``(iteration, loss, ms)`` of each ``iter`` line nanoGPT printed."""
    return [(int(i), float(loss), float(ms)) for i, loss, ms in ITER.findall(stdout)]
