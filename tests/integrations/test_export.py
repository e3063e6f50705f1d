"""gpudash export: parquet and csv round trips against load_run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from gpudash import load_run
from gpudash.cli import main
from gpudash.monitor import Monitor


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "exp"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Monitor(path, host_hz=50, activations_every=2, handle_signals=False) as m:
        m.watch(model, opt)
        m.event("note", "started", lr=1e-3, tags=["a", "b"])
        for _ in range(8):
            x = torch.randn(4, 8)
            with m.step(samples=4):
                with m.phase("forward"):
                    loss = model(x).pow(2).mean()
                with m.phase("backward"):
                    loss.backward()
                with m.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                m.log(loss=loss, lr=1e-3)
    return path


def _compare(exported: pd.DataFrame, original: pd.DataFrame) -> None:
    assert list(exported.columns) == list(original.columns)
    pd.testing.assert_frame_equal(exported.reset_index(drop=True), original.reset_index(drop=True),
                                  check_dtype=False)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_round_trip(run_dir: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / fmt
    assert main(["export", str(run_dir), "--format", fmt, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    run = load_run(run_dir)
    read = pd.read_parquet if fmt == "parquet" else pd.read_csv
    for table in ("steps", "memory", "activations", "host"):
        original = getattr(run, table)
        assert len(original), table
        assert table in printed
        _compare(read(out / f"{table}.{fmt}"), original)
    events = read(out / f"events.{fmt}")
    assert list(events["kind"]) == list(run.events["kind"])
    note = events[events["kind"] == "note"].iloc[0]
    assert json.loads(note["data"]) == {"lr": 1e-3, "tags": ["a", "b"]}
    assert not (out / f"device.{fmt}").exists()  # nothing recorded on CPU: no empty file
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["name"] == "exp"
    run.close()


def test_export_default_folder_and_errors(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(run_dir), "--format", "csv", "--tables", "steps"]) == 0
    assert (run_dir / "export" / "steps.csv").is_file()
    assert main(["export", str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--tables", "steps,bogus"]) == 2
    assert "unknown table(s) bogus" in capsys.readouterr().err
