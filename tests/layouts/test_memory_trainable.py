"""The memory chart draws frozen and trainable parameters apart (LoRA on a frozen base)."""

from __future__ import annotations

import pandas as pd
import pytest

from gpudash.server.layouts.memory import memory_at, memory_figure, memory_series


def _mem(trainable: int) -> pd.DataFrame:
    return pd.DataFrame({"step": [0, 1], "rank": 0, "params_bytes": [1000, 1000],
                         "trainable_params_bytes": [trainable, trainable], "grads_bytes": [trainable, trainable],
                         "optimizer_bytes": [0, 2 * trainable], "activations_bytes": [50, 50]})


def test_frozen_and_trainable_parameters_are_two_bands() -> None:
    mem = _mem(100)
    labels = [s.name for s in memory_series(mem)]
    assert labels[:2] == ["parameters (frozen)", "parameters (trainable)"] and "parameters" not in labels
    fig, _ = memory_figure(mem, {}, pd.DataFrame())
    ys = {t["name"]: list(t["y"]) for t in fig.data}
    scale = 1000 / max(ys["parameters (frozen)"][0] + ys["parameters (trainable)"][0], 1e-12)
    assert [round(v * scale) for v in ys["parameters (frozen)"]] == [900, 900]
    assert [round(v * scale) for v in ys["parameters (trainable)"]] == [100, 100]
    at = memory_at(mem, 1)
    assert at["parameters (frozen)"] == 900 and at["parameters (trainable)"] == 100


def test_all_trainable_stays_one_band() -> None:
    labels = [s.name for s in memory_series(_mem(1000))]
    assert "parameters" in labels and not any("frozen" in label for label in labels)


def test_a_live_page_with_frozen_parameters_is_accepted_back() -> None:
    """The live state a LoRA run's page sends back each tick holds the frozen band's series: the server's input
    check knows every transform a series draws (it refused "frozen": every live tick of such a run was a 400)."""
    from gpudash.server.layouts.inputs import live_state
    from gpudash.server.layouts.series import FNS, Series, series_xy

    specs = [s.as_dict() for s in memory_series(_mem(100))]
    assert "frozen" in {s["fn"] for s in specs}
    state = live_state({"run": "lora", "rank": 0, "specs": {"memory-graph": specs}})
    frozen = next(Series.from_dict(d) for d in state["specs"]["memory-graph"] if d["fn"] == "frozen")
    assert series_xy(frozen, _mem(100))[1] == pytest.approx([900 / frozen.scale] * 2, rel=1e-5)
    for fn in FNS:  # and every other transform
        live_state({"run": "x", "specs": {"g": [Series("steps", "loss", "loss", fn=fn).as_dict()]}})
