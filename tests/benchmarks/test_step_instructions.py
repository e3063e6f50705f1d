"""benchmarks/step_instructions.py: its variants run, and it reads callgrind's per-thread counts (Valgrind itself
is not needed here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "step_instructions.py"


@pytest.mark.parametrize("variant", ["bare", "floor", "gpudash", "gpudash, rows handed nowhere"])
def test_each_variant_runs_its_steps(variant: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--child", variant, "50", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if variant.startswith("gpudash"):
        from gpudash import load_run

        run = load_run(tmp_path / "run")
        try:  # rows handed nowhere: the run holds no step; else the warm-up's and the counted steps
            assert len(run.steps) == (0 if "nowhere" in variant else 250)
        finally:
            run.close()


def test_the_main_threads_count_and_the_others_are_read_apart(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from step_instructions import _counts

    for name, total in (("cg.2.100.77-01", 1000), ("cg.2.100.77-02", 300), ("cg.2.100.77-03", 20)):
        (tmp_path / name).write_text(f"# callgrind format\nevents: Ir\nfl=x\nfn=y\n1 {total}\nsummary: {total}\n")
    assert _counts(str(tmp_path / "cg.2.100.")) == (1000, 320)
