"""The run of the first-paint benchmark (benchmarks/first_paint.py), written by each tool.

``--steps`` steps with 8 scalars, the loss ×8 at one known step. gpudash writes
it through its real writer (``Recorder``: step rows with phases and the
scalars, a memory row and a device sample per step); trackio logs the same
values with ``trackio.log``; tensorboardX's event writer stores them (one event
per step holding the 8 scalars, as merged summaries do; ``add_scalar`` per
value writes the same points 7× slower). The peers' writers run in
``.venv-bench``: ``python benchmarks/paint_run.py --_write TOOL DIR STEPS``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH_VENV = Path(os.environ.get("BENCH_VENV", ROOT / ".venv-bench"))
if not (BENCH_VENV / "bin" / "python").exists() and Path("/work/main/.venv-bench/bin/python").exists():
    BENCH_VENV = Path("/work/main/.venv-bench")  # a worktree without its own bench venv

#: The 8 scalars every tool records; "loss" sorts first (trackio and TensorBoard order their charts by name).
SCALARS = ("loss", "lr", "mfu", "param_norm", "perplexity", "tokens_per_s", "update_ratio", "val_accuracy")
SPIKE_FACTOR = 8.0
PROJECT = "firstpaint"
RUN = "run"
STEP_S = 0.1


def spike_step(steps: int) -> int:
    """The one step whose loss is ``SPIKE_FACTOR`` times what it would be (away from both ends)."""
    return int(steps * 0.637)


def series(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The 8 scalars of every step (float64), the loss spiked ×8 at :func:`spike_step`."""
    rng = np.random.default_rng(seed)
    s = np.arange(steps, dtype=float)
    decay = np.exp(-s / max(steps * 0.3, 1.0))
    loss = 0.5 + 2.5 * decay + 0.05 * rng.random(steps)
    loss[spike_step(steps)] *= SPIKE_FACTOR
    return {
        "loss": loss,
        "lr": 3e-4 * np.minimum(1.0, (s + 1) / max(steps * 0.01, 1.0)),
        "mfu": 0.41 + 0.01 * rng.standard_normal(steps),
        "param_norm": 100.0 + s / max(steps, 1),
        "perplexity": np.exp(np.minimum(loss, 20.0)),
        "tokens_per_s": 3.2e5 + 1e4 * rng.standard_normal(steps),
        "update_ratio": 1e-3 * (1.0 + 0.1 * rng.random(steps)),
        "val_accuracy": 1.0 - 0.9 * decay + 0.01 * rng.random(steps),
    }


def spike_value(steps: int) -> float:
    return float(series(steps)["loss"][spike_step(steps)])


# ---- writing the run, once per tool ------------------------------------------------------------------------
def write_gpudash(run_dir: Path, steps: int) -> float:
    """The run through gpudash's own writer: what a Monitor would have recorded, without a training loop."""
    from gpudash.store.writer import Recorder

    t0 = time.perf_counter()
    start = time.time() - steps * STEP_S
    values = series(steps)
    rec = Recorder(run_dir, flush_interval=3600, capacity=400_000,
                   meta={"name": "first-paint", "device": "cuda:0", "device_name": "synthetic H100",
                         "device_capacity_bytes": 80 * 2**30, "created_at": start,
                         "phases": ["data", "forward", "backward", "optimizer"]})
    rng = np.random.default_rng(1)
    batch = 100_000
    for lo in range(0, steps, batch):
        n = min(batch, steps - lo)
        dur = (STEP_S + 0.01 * rng.standard_normal(n)).tolist()
        cols = {k: v[lo:lo + n].tolist() for k, v in values.items()}
        for i in range(n):
            s = lo + i
            t = start + s * STEP_S
            row = {"step": s, "time": t, "duration_s": dur[i], "data_s": 0.005, "forward_s": 0.03,
                   "backward_s": 0.05, "optimizer_s": 0.015, "samples": 32, "tokens": 32 * 1024}
            for k in SCALARS:
                row[k] = cols[k][i]
            rec.put("steps", row)
            frac = (s % 1000) / 1000
            rec.put("memory", {"step": s, "time": t, "params_bytes": 2e9, "grads_bytes": 2e9,
                               "optimizer_bytes": 8e9, "activations_bytes": 30e9 + 1e9 * frac,
                               "allocated_bytes": 42e9 + 1e9 * frac, "reserved_bytes": 50e9})
            rec.put("device", {"time": t + 0.05, "gpu": 0, "sm_active_pct": 80.0, "pcie_tx_mib_s": 100.0,
                               "power_w": 500.0, "temp_c": 60.0})
        rec.flush(timeout=3600)
    rec.close()
    return time.perf_counter() - t0


def _write_trackio(root: Path, steps: int) -> None:
    os.environ["TRACKIO_DIR"] = str(root)
    import trackio

    cols = {k: v.tolist() for k, v in series(steps).items()}
    run = trackio.init(project=PROJECT, name=RUN, auto_log_cpu=False, auto_log_gpu=False)
    for i in range(steps):
        trackio.log({k: cols[k][i] for k in SCALARS}, step=i)
    trackio.finish()
    sender = getattr(run, "_local_sender_thread", None)
    if sender is not None:  # finish() waits 30 s for its sender, a long run needs longer: not a row lost
        sender.join()
    import sqlite3

    with sqlite3.connect(root / f"{PROJECT}.db") as db:
        stored = db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
    if stored != steps:
        raise RuntimeError(f"trackio stored {stored} of {steps} steps")


def _write_tensorboard(root: Path, steps: int) -> None:
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

    cols = {k: v.tolist() for k, v in series(steps).items()}
    start = time.time() - steps * STEP_S
    w = SummaryWriter(str(root / RUN), flush_secs=3600, max_queue=100_000)
    fw = w._get_file_writer()
    for i in range(steps):
        fw.add_summary(Summary(value=[Summary.Value(tag=k, simple_value=cols[k][i]) for k in SCALARS]), i,
                       start + i * STEP_S)
    w.close()


WRITERS: dict[str, Callable[[Path, int], None]] = {"trackio": _write_trackio, "tensorboard": _write_tensorboard}


def write_all(work: Path, steps: int, tools: Iterable[str]) -> dict[str, float]:
    """Write the run for every tool into ``work/<tool>-<steps>`` (kept if already there): seconds each took,
    the peers in ``.venv-bench`` subprocesses at the same time as gpudash's writer in this process."""
    took: dict[str, float] = {}
    procs = {}
    for tool in tools:
        dest = work / f"{tool}-{steps}"
        if (dest / "done").exists():
            continue
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        if tool != "gpudash":
            procs[tool] = (time.perf_counter(), subprocess.Popen(
                [str(BENCH_VENV / "bin" / "python"), __file__, "--_write", tool, str(dest), str(steps)],
                stdout=subprocess.DEVNULL))
    for tool in tools:
        dest = work / f"{tool}-{steps}"
        if tool == "gpudash" and not (dest / "done").exists():
            took[tool] = write_gpudash(dest / RUN, steps)
            (dest / "done").touch()
    while procs:
        for tool, (t0, proc) in list(procs.items()):
            if proc.poll() is None:
                continue
            if proc.returncode != 0:
                raise RuntimeError(f"writing the {tool} run failed (is {BENCH_VENV} set up? benchmarks/setup_env.sh)")
            took[tool] = time.perf_counter() - t0
            (work / f"{tool}-{steps}" / "done").touch()
            del procs[tool]
        time.sleep(0.2)
    return took



if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--_write":
        WRITERS[sys.argv[2]](Path(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: paint_run.py --_write trackio|tensorboard DIR STEPS (run by first_paint.py)")
