"""The command line as a user meets it: bad flags are one line; serve --metrics scrapes."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.app import serve_in_thread


@pytest.mark.parametrize("argv", [["train", "--bogus"], ["info"], ["serve", "--port", "x"], ["nosuchcommand"]])
def test_bad_flags_are_one_line(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "gpudash", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudash: error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_serve_with_metrics_exposes_prometheus(tmp_path: Path, train_tiny: Any) -> None:
    train_tiny(tmp_path / "exp1", steps=5)
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0, metrics=True)
    try:
        text = urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30).read().decode()
    finally:
        stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    step = families["gpudash_step"].samples
    assert any(s.labels.get("run") == "exp1" and s.labels.get("rank") == "0" for s in step)
    assert "gpudash_memory_category_bytes" in families
