"""The memory chart tells the OOM's story: the stack under the measured peak, the limit the
OOM was judged against, each step's prediction."""

from __future__ import annotations

import pandas as pd

from gpudash.server.layouts import memory

BUDGET = 3_660_000
META = {"preflight": {"capacity_bytes": BUDGET, "capacity_source": "--memory-budget-gb 0.0034 (measured bytes)"},
        "config": {"memory_budget_gb": BUDGET / 2**30}, "estimate": {"peak_bytes": 3_900_000}}


def _memory() -> pd.DataFrame:
    rows = []
    for step in range(6):
        act = 600_000 + 50_000 * step if step % 2 else None
        rows.append({"step": step, "time": float(step), "params_bytes": 870_656, "grads_bytes": 0,
                     "grads_total_bytes": 870_656, "optimizer_bytes": 1_741_420, "activations_bytes": act,
                     "peak_bytes": 2_612_076 + 600_000 + 50_000 * step,
                     "predicted_peak_bytes": 2_612_076 + 600_100 + 50_000 * step})
    return pd.DataFrame(rows)


def test_stack_peak_and_the_limit_the_oom_met() -> None:
    events = pd.DataFrame([{"step": 5, "kind": "oom", "message": "out of memory"}])
    fig, specs = memory.memory_figure(_memory(), META, events)
    names = {t["name"]: t for t in fig.data}
    assert {"measured peak", "estimate (peak)", "activations", "parameters"} <= set(names)
    assert "stackgroup" not in names["measured peak"] and "stackgroup" in names["activations"]
    texts = [a.text for a in fig.layout.annotations]
    # the OOM's own limit (the pre-flight capacity), with the digits the verdict quotes
    assert "budget 3.49 MiB" in texts and "OOM" in texts
    assert not any(t.startswith("estimate") for t in texts)  # drawn per step instead
    # gradients were freed at the peak: the stack stays under the measured peak on every measured step
    mem = _memory()
    stack = mem[["params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes"]].fillna(0).sum(axis=1)
    assert (stack <= mem["peak_bytes"]).all()


def test_capacity_lines_label_a_memory_cap_and_the_device() -> None:
    meta = {"device_total_bytes": 80 * 2**30,
            "preflight": {"capacity_bytes": 8 * 2**30, "capacity_source": "--memory-cap-gb 8 (set_per_process_memory_fraction)"}}
    assert memory.capacity_lines(meta) == [("device capacity", 80 * 2**30, "solid"), ("memory cap", 8 * 2**30, "dot")]
    # older runs without a pre-flight record: the configured budget
    assert memory.capacity_lines({"config": {"memory_budget_gb": 1.0}}) == [("budget", 2**30, "dot")]


def test_memory_at_the_cursor_quotes_that_steps_measured_peak() -> None:
    at = memory.memory_at(_memory(), 3)
    assert at["step"] == 3 and at["peak"] == 2_612_076 + 750_000 and at["activations"] == 750_000
    fig = memory.memory_at_figure(at)
    assert "measured peak 3.21 MiB" in fig.layout["title"]["text"]
    assert "peak" not in fig.data[0]["x"]
