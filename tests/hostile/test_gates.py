"""Gates that cannot be fooled (issue 44, item 4): ``--no-nonfinite`` is judged from every step's loss (a
run NaN from step k on fails), NaN/inf rule values are refused, and a rules file with a value of the wrong
type or nested 100,000 deep is one line and exit 2 (bad input), never a traceback and exit 1 (rule broken)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpudash.cli import main
from gpudash.store.writer import Recorder


def _run(path: Path, nan_from: int | None, n: int = 20, every: int = 1) -> Path:
    rec = Recorder(path, flush_interval=60, meta={"name": path.name})
    for i in range(n):
        row = {"step": i, "time": 1e9 + i, "duration_s": 0.1, "tokens": 10.0}
        if i % every == 0:
            row["loss"] = math.nan if nan_from is not None and i >= nan_from else 2.0 - i / n
        rec.put("steps", row)
        rec.put("memory", {"step": i, "time": 1e9 + i, "allocated_bytes": 1e6, "reserved_bytes": 2e6})
    rec.close()
    return path


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["check", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("k", [3, 12])
def test_a_run_nan_from_step_k_on_fails_no_nonfinite(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     k: int) -> None:
    run = _run(tmp_path / "nan", nan_from=k)
    rc, out, _ = _check(capsys, str(run), "--no-nonfinite")
    assert rc == 1 and f"FAIL no_nonfinite: {20 - k} non-finite step(s), the first at step {k}" in out, out


def test_sparse_logging_is_not_a_nan_but_its_end_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _check(capsys, str(_run(tmp_path / "every5", nan_from=None, n=40, every=5)), "--no-nonfinite")
    assert rc == 0, out  # the loss logged every 5th step: the steps between are not NaN
    rc, out, _ = _check(capsys, str(_run(tmp_path / "every5nan", nan_from=20, n=40, every=5)), "--no-nonfinite")
    assert rc == 1 and "the first at step 21" in out, out  # then nothing for longer than any gap before


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nan_and_inf_rule_values_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    run = _run(tmp_path / "ok", nan_from=None)
    rc, out, err = _check(capsys, str(run), f"--max-peak-gib={value}")
    assert rc == 2 and err.startswith("gpudash: error: max_peak_gib") and len(err.strip().splitlines()) == 1, err
    rules = tmp_path / "gates.toml"
    for key in ("max_peak_gib", "max_step_time_increase"):
        rules.write_text(f"{key} = {value}\n")
        rc, out, err = _check(capsys, str(run), "--rules", str(rules))
        assert rc == 2 and key in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("text", [
    "baseline = 5",
    "baseline = [1, 2]",
    "max_peak_increase = {a = 1}",
    "max_peak_increase = [5]",
    "max_peak_gib = 1979-05-27",
    "max_spikes = 07:32:00",
    "no_oom = \"yes\"",
    "[check]\nmax_peak_gib = {deep = {er = 1}}",
    "x = " + "[" * 100_000 + "]" * 100_000,
    "max_peak_gib = " + "[" * 100_000 + "]" * 100_000,
])
def test_a_rules_file_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               text: str) -> None:
    run = _run(tmp_path / "ok", nan_from=None)
    rules = tmp_path / "gates.toml"
    rules.write_text(text + "\n")
    rc, out, err = _check(capsys, str(run), "--rules", str(rules), "--no-oom")
    assert rc == 2, (rc, out, err[-500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpudash: error: --rules {rules}") and len(lines[0]) < 400
