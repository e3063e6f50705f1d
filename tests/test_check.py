"""``gpudash check``: CI gates on the run's facts (the numbers the report prints), exit 0 / 1 / 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.cli import main

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def _make(run_dir: Path, peak: float, *, nan_at: int | None = None, steps: int = 30) -> Path:
    from gpudash.monitor import Monitor

    with Monitor(run_dir, host_hz=0, handle_signals=False, flush_interval=0.05) as mon:
        for i in range(steps):
            with mon.step(samples=2):
                mon.log(loss=float("nan") if i == nan_at else 2.0 + 0.004 * math.sin(1.3 * i))
                mon.log_memory(peak_bytes=int(peak * (0.9 + 0.1 * (i == steps // 2))))
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("check")
    return {"base": _make(root / "base", 10 * GIB), "up10": _make(root / "up10", 11 * GIB),
            "up2": _make(root / "up2", 10.2 * GIB), "nan": _make(root / "nan", 10 * GIB, nan_at=12)}


def test_peak_grown_10_pct_fails_and_2_pct_passes(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", str(runs["up10"]), "--baseline", str(runs["base"]), "--max-peak-increase", "5%"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1
    assert out == ["FAIL max_peak_increase: peak memory 11.0 GiB is +10.0 % against the baseline's 10.0 GiB "
                   "(limit +5 %)"]
    assert main(["check", str(runs["up2"]), "--baseline", str(runs["base"]), "--max-peak-increase", "5%"]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 rule(s) hold")


def test_the_numbers_are_the_facts(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.analysis.facts import run_facts
    from gpudash.store import load_run

    assert main(["check", str(runs["up10"]), "--baseline", str(runs["base"]), "--max-peak-increase", "5",
                 "--max-step-time-increase", "1000", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    r, b = load_run(runs["up10"]), load_run(runs["base"])
    fr, fb = run_facts(r), run_facts(b)
    r.close()
    b.close()
    peak, step = doc["rules"]
    assert (peak["value"], peak["baseline"]) == (fr.headline["peak_memory_bytes"], fb.headline["peak_memory_bytes"])
    assert (step["value"], step["baseline"]) == (fr.headline["step_time_median_s"], fb.headline["step_time_median_s"])
    assert doc["passed"] is False and peak["passed"] is False and step["passed"] is True


def test_one_line_per_broken_rule(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", str(runs["nan"]), "--no-nonfinite", "--no-oom", "--max-peak-gib", "9", "--max-spikes", "0"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1
    assert out == ["FAIL max_peak_gib: peak memory 10.0 GiB (limit 9 GiB)",
                   "FAIL no_nonfinite: 1 non-finite step(s), the first at step 12"]


def test_rules_from_toml_and_flags_override(runs: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    gates = tmp_path / "gates.toml"
    gates.write_text(f'# CI gates\n[check]\nbaseline = "{os.path.relpath(runs["base"], tmp_path)}"\n'
                     'max_peak_increase = "5%"\nno_nonfinite = true\nmax_spikes = 0\n')
    assert main(["check", str(runs["up10"]), "--rules", str(gates)]) == 1
    assert capsys.readouterr().out.startswith("FAIL max_peak_increase")
    assert main(["check", str(runs["up10"]), "--rules", str(gates), "--max-peak-increase", "20%"]) == 0
    assert main(["check", str(runs["up2"]), "--rules", str(gates)]) == 0


def test_rules_file_is_read_as_toml(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole of TOML (tomllib; tomli on 3.10): dotted keys and inline tables, which a hand-written
    subset did not read; a file that is not TOML is one line naming it."""
    gates = tmp_path / "gates.toml"
    gates.write_text('check.max_peak_gib = 1e-9\ncheck.limits = { unused = 1 }\n')
    assert main(["check", str(runs["base"]), "--rules", str(gates)]) == 2
    assert "unknown rule(s) limits" in capsys.readouterr().err
    gates.write_text('check.max_peak_gib = 1e-9  # any run breaks it\n')
    assert main(["check", str(runs["base"]), "--rules", str(gates)]) == 1
    assert capsys.readouterr().out.startswith("FAIL max_peak_gib")
    gates.write_text("max_spikes == 3\n")
    assert main(["check", str(runs["base"]), "--rules", str(gates)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--rules {gates}: not valid TOML" in err[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-peak-increase", "5%"], "--max-peak-increase needs --baseline RUN"),
    ([], "no rules to check"),
    (["--max-peak-increase", "five"], "expected a percentage like 5%"),
    (["--baseline", "/nonexistent/run", "--max-peak-increase", "5"], "--baseline /nonexistent/run: no such run"),
    (["--rules", "/nonexistent/gates.toml"], "--rules /nonexistent/gates.toml: cannot read it"),
])
def test_bad_input_is_exit_2_and_one_line(runs: dict[str, Path], argv: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "gpudash", "check", str(runs["up2"]), *argv], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_bad_rules_file_and_unrecorded_numbers(runs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("max_peak = 5\n")
    assert main(["check", str(runs["up2"]), "--rules", str(bad)]) == 2
    empty = tmp_path / "empty"
    from gpudash.monitor import Monitor

    with Monitor(empty, host_hz=0, handle_signals=False) as mon:
        with mon.step():
            pass
    assert main(["check", str(empty), "--max-peak-gib", "5"]) == 2
