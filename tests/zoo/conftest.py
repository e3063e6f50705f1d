"""The zoo: training code nobody here wrote, run unchanged under ``gpudash run`` and checked against the
numbers the scripts themselves print (or, where they print rounded numbers, what ``probe.py`` saw them do)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
ZOO = Path(__file__).resolve().parent


def zoo_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def gpudash_run(run_dir: Path, *command: str, cwd: Path, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``gpudash run --run-dir RUN_DIR FLAGS -- COMMAND`` in ``cwd``; asserts it exited 0."""
    proc = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(run_dir), *flags, "--", *command],
                          cwd=cwd, env=zoo_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def storage_bytes(tensors: object) -> int:
    """Bytes of the distinct storages of ``tensors`` (tied weights once)."""
    seen: dict[int, int] = {}
    for t in tensors:  # type: ignore[attr-defined]
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


@pytest.fixture(scope="session")
def zoo() -> SimpleNamespace:
    """The helpers above, for the zoo's test modules (tests import no sibling modules)."""
    return SimpleNamespace(root=ROOT, dir=ZOO, run=gpudash_run, storage_bytes=storage_bytes, env=zoo_env)
