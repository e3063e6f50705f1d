from __future__ import annotations

from pathlib import Path

import pytest
from helpers.runmaker import HOSTILE, train


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished runs: ``rich`` (every view has data, a hostile name) and ``plain`` (CPU defaults)."""
    root = tmp_path_factory.mktemp("runs")
    train(root / "rich", 40, rich=True, name=f"rich {HOSTILE}")
    train(root / "plain", 30)
    return root
