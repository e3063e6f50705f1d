"""Record the sample runs in ``sample_runs/`` with gpudash's trainer on CPU.

    python scripts/make_sample_runs.py [OUT_DIR] [--only NAME ...]   # default: sample_runs

Each run is ``gpudash.trainer.train`` on the tiny preset with the trainer's own
switches and testing aids (``--memory-budget-gb``, ``--slow-data-ms``,
``--inject-nan-at-step``...), so what the dashboard and ``gpudash report``
show about them happened for real. ``SAMPLES`` also says what the analysis
must conclude about each; ``tests/test_sample_runs.py`` checks it. Runs are
short, sample the host once a second, measure activations on every step (so
each step's memory-by-category stack is complete and sits under its measured
peak), and are compacted (4 KiB SQLite pages,
no WAL files) so the folder stays a few MB.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SAMPLES", "Sample", "compact", "main", "record"]

_MB = 1e6 / 2**30  # --memory-budget-gb is in GiB


@dataclass
class Sample:
    name: str
    description: str
    config: dict[str, Any] = field(default_factory=dict)
    """TrainConfig fields on top of the tiny preset on CPU."""
    expect_status: str = "finished"
    expect_kinds: tuple[str, ...] = ()
    """Verdict kinds ``gpudash.analysis.summarize`` must return for this run."""
    device: str = "cpu"
    """``cuda``: recorded on a real GPU by the device pack (``scripts/device_check.py``, its ``samples`` part, the
    same flags as ``config``), copied here and compacted; this script does not re-record it."""


_STRATEGY = {"steps": 40, "batch": 8, "effective_batch": 8}
SAMPLES: dict[str, Sample] = {s.name: s for s in [
    Sample("healthy", "tiny GPT, fp32, adaptive batch: finishes, compute-bound, nothing wrong",
           {"steps": 60}, expect_kinds=("compute-bound",)),
    Sample("oom-crash", "micro-batch 1 under a 3.66 MB memory budget: a long enough batch does not fit, "
           "the run dies of OOM", {"steps": 200, "batch": 1, "effective_batch": 1, "memory_budget_gb": 3.66 * _MB},
           expect_status="crashed", expect_kinds=("oom:did not fit",)),
    Sample("oom-recovered", "adaptive batch under an 8 MB budget: grows, hits OOM, shrinks and retries",
           {"steps": 60, "memory_budget_gb": 8 * _MB, "effective_batch": 32}, expect_kinds=("oom:did not fit",)),
    Sample("input-bound", "data phase sleeps 150 ms per step (--slow-data-ms): the model waits for data",
           {"steps": 30, "slow_data_ms": 150}, expect_kinds=("input-bound",)),
    Sample("precision-fallback", "fp16 with loss scaling; non-finite loss injected at steps 20-23: "
           "falls back to fp32", {"steps": 40, "precision": "fp16", "inject_nan_at_steps": (20, 21, 22, 23)},
           expect_kinds=("precision-fallback", "non-finite")),
    Sample("strategy-none", "strategy set: fp32, no checkpointing, micro-batch 8", dict(_STRATEGY),
           expect_kinds=("compute-bound",)),
    Sample("strategy-block-ckpt", "strategy set: every block checkpointed", {**_STRATEGY, "ckpt": "block"},
           expect_kinds=("compute-bound",)),
    Sample("strategy-bf16", "strategy set: bf16 autocast", {**_STRATEGY, "precision": "bf16"},
           expect_kinds=("compute-bound",)),
    Sample("strategy-offload", "strategy set: optimizer state offloaded (on CPU this measures only the copies)",
           {**_STRATEGY, "offload": "optimizer"}),
    Sample("gpu-healthy", "NVIDIA H200: small preset, fp32, micro-batch 16, activations every step, snapshots every "
           "20 steps, NVML/GPM at 10 Hz (other pack runs shared the GPU)",
           {"preset": "small", "steps": 40, "batch": 16, "effective_batch": 16}, expect_kinds=("compute-bound",),
           device="cuda"),
    Sample("gpu-oom-crash", "NVIDIA H200 under --memory-cap-gb 1.5: gpt2-124m at micro-batch 1 dies of a real CUDA "
           "OOM in its first step, with the allocator's snapshot at the OOM",
           {"preset": "gpt2-124m", "steps": 5, "batch": 1, "effective_batch": 1, "memory_cap_gb": 1.5},
           expect_status="crashed", expect_kinds=("oom:did not fit",), device="cuda"),
]}


def record(run_dir: str | Path, sample: Sample) -> Path:
    """Train ``sample`` into ``run_dir`` (replaced if it exists); a run that dies of OOM is kept."""
    import torch

    from gpudash.options import MonitorOptions
    from gpudash.trainer import TrainConfig, train

    if sample.device != "cpu":
        raise SystemExit(f"{sample.name} is recorded on a GPU by scripts/device_check.py (its samples part)")
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    torch.set_num_threads(1)  # tiny matrices: one thread is as fast and shares a CI box
    cfg = TrainConfig(run_dir=run_dir, name=sample.name, device="cpu", seed=0,
                      monitor=MonitorOptions(host_hz=1.0, activations_every=1), **sample.config)
    try:
        train(cfg)
    except MemoryError:
        if sample.expect_status != "crashed":
            raise
    return run_dir


def compact(run_dir: Path) -> None:
    """Shrink a finished run for committing: checkpoint the WAL, rewrite each
    database with 4 KiB pages (the writer uses 64 KiB pages for fast appends,
    which makes a short run ~2 MB), and leave no -wal/-shm files behind."""
    import sqlite3

    for db in sorted(run_dir.glob("rank*.db")):
        con = sqlite3.connect(db)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("PRAGMA page_size=4096")
        con.execute("VACUUM")
        con.execute("PRAGMA journal_mode=WAL")
        con.close()
    for f in list(run_dir.glob("*-wal")) + list(run_dir.glob("*-shm")):
        f.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Record gpudash's sample runs with the trainer on CPU.")
    p.add_argument("out", nargs="?", type=Path, default=Path("sample_runs"))
    p.add_argument("--only", nargs="*", help="sample names (default: all)")
    args = p.parse_args(argv)
    names = args.only or [n for n, s in SAMPLES.items() if s.device == "cpu"]  # the GPU ones stay as recorded
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        t0 = time.time()
        run_dir = record(args.out / name, SAMPLES[name])
        compact(run_dir)
        size = sum(f.stat().st_size for f in run_dir.iterdir())
        print(f"{name:22s} {size / 1e3:6.0f} kB {time.time() - t0:6.1f} s  {SAMPLES[name].description}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
