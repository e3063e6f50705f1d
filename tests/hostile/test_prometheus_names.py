"""/metrics over names that collide once cleaned (issue 26): one HELP/TYPE per family, one sample per
label set, a cap on series per run, and promtool agrees."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from helpers.hostile_cases import colliding_prometheus_names, healthy
from prometheus_client import generate_latest

from gpudash.server import promnames
from gpudash.server.metrics import metric_name, metrics_registry


def _scrape(runs: Path) -> str:
    return generate_latest(metrics_registry(runs)).decode()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    healthy(runs / "good")
    healthy(runs / "colliding")
    colliding_prometheus_names(runs / "colliding")
    return runs


def test_metric_name_cleaning() -> None:
    assert metric_name('gpudash_memory_a"b_bytes') == "gpudash_memory_a_b_bytes"
    assert metric_name("9lives") == "_9lives"
    assert metric_name("gpudash_ok:sub") == "gpudash_ok:sub"


def test_one_family_one_sample_per_label_set(runs: Path) -> None:
    text = _scrape(runs)
    helps = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# HELP "))
    assert helps and max(helps.values()) == 1, [k for k, v in helps.items() if v > 1]
    samples = Counter(line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#"))
    assert max(samples.values()) == 1, [k for k, v in samples.items() if v > 1]
    assert 'gpudash_memory_a_b_bytes{' in text and 'gpudash_learning_rate{' in text


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is not installed (apt-get install prometheus; .ci/run installs it)")
def test_promtool_accepts_colliding_names(runs: Path) -> None:
    proc = subprocess.run(["promtool", "check", "metrics"], input=_scrape(runs), capture_output=True, text=True,
                          timeout=60)
    # 1: the text does not parse (a second HELP line for one family, a duplicate sample); 3: naming advice
    # only (Debian's promtool calls ``a_b_bytes`` an abbreviated unit), which is about the user's column names
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 3) and "error" not in out, out


def test_series_cap_per_run(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promnames, "MAX_SERIES_PER_RUN", 5)
    text = _scrape(runs)
    for run in ("good", "colliding"):
        n = sum(1 for line in text.splitlines() if f'run="{run}"' in line and not line.startswith("#")
                and not line.startswith("gpudash_series_dropped"))
        assert n == 5, (run, n)
        assert f'gpudash_series_dropped{{run="{run}"}}' in text
