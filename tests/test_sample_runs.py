"""Every shipped sample run loads cleanly and the analysis says what sample_runs/README.md promises."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.analysis import summarize

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "sample_runs"


def _samples() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("make_sample_runs", ROOT / "scripts" / "make_sample_runs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return dict(mod.SAMPLES)


SAMPLES = _samples()


def test_every_sample_is_shipped_and_documented() -> None:
    shipped = {p.name for p in SAMPLE_DIR.iterdir() if p.is_dir()}
    assert shipped == set(SAMPLES)
    readme = (SAMPLE_DIR / "README.md").read_text()
    for name in SAMPLES:
        assert f"`{name}/`" in readme
    total = sum(f.stat().st_size for f in SAMPLE_DIR.rglob("*") if f.is_file())
    assert total < 5e6


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_run_loads_with_its_verdicts(name: str, tmp_path: Path) -> None:
    import shutil

    src = SAMPLE_DIR / name
    committed = [f.name for f in src.iterdir()]
    assert "rank0.db" in committed and "run.json" in committed
    # read a copy: opening a WAL database leaves -wal/-shm files next to it
    run_dir = tmp_path / name
    shutil.copytree(src, run_dir, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    run = gpudash.load_run(run_dir)
    sample = SAMPLES[name]
    assert run.problems == []
    assert run.status == sample.expect_status
    if sample.expect_status == "crashed" and not len(run.steps):  # died in its first step (gpu-oom-crash)
        assert "oom" in set(run.events["kind"])
    else:
        assert len(run.steps) > 0
    kinds = {v.kind for v in summarize(run)}
    assert set(sample.expect_kinds) <= kinds, kinds
    from gpudash.analysis.facts import run_facts

    assert run_facts(run).leak is None  # no sample run leaks (issue 37: no false leak)
    run.close()
