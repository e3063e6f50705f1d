"""The integration examples run as documented (a few steps each, CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from gpudash import load_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,framework", [("hf_trainer", "transformers"), ("lightning_example", "lightning")])
def test_example_records_a_run(name: str, framework: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    run_dir = tmp_path / "runs" / name
    _load(name).main([str(run_dir), "--steps", "3", "--batch-size", "2", "--ctx", "16"])
    run = load_run(run_dir)
    assert run.status == "finished"
    assert list(run.steps["step"]) == [1, 2, 3]  # the framework's global_step
    assert run.steps["loss"].notna().all() and run.memory["params_bytes"].gt(0).all()
    assert run.meta["config"]["framework"] == framework
    run.close()
