from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers.trainrun import FAST_MONITOR, run_train

__all__ = ["FAST_MONITOR", "run_train"]
