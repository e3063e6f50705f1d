"""Whatever a training loop passes to ``monitor.log``, the run stays readable and complete (issue 12).

Property tests (hypothesis): any int (beyond 64 bits too), float (nan, inf), bool, str (lone
surrogates), bytes, numpy and torch scalars, multi-element tensors, and odd names (unicode, quotes,
spaces, very long, reserved). After flush() and close(): the writer lived through all of it,
``load_run`` reads the run, and every step is there.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpudash
from gpudash.monitor import Monitor

torch = pytest.importorskip("torch")

_NP_INT = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
_NP_FLOAT = (np.float16, np.float32, np.float64, np.longdouble)


def _np_int(x: int) -> Any:
    for t in _NP_INT[::-1]:
        info = np.iinfo(t)
        if info.min <= x <= info.max:
            return t(x)
    return np.uint64(2**64 - 1)


def _np_float(p: tuple[Any, float]) -> Any:
    with np.errstate(over="ignore"):
        return p[0](p[1])


values = st.one_of(
    st.none(),
    st.integers(),  # unbounded: 2**64, -2**200, 10**400 ...
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(),  # includes lone surrogates
    st.binary(max_size=64),
    st.integers(min_value=-(2**63), max_value=2**64 - 1).map(_np_int),
    st.tuples(st.sampled_from(_NP_FLOAT), st.floats()).map(_np_float),
    st.booleans().map(np.bool_),
    st.floats(width=32).map(lambda x: torch.tensor(x)),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda x: torch.tensor(x)),
    st.floats(width=32).map(lambda x: torch.tensor(x, requires_grad=True) * 2),
    st.lists(st.floats(width=32), min_size=2, max_size=4).map(lambda xs: torch.tensor(xs)),  # not a scalar
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.floats(), max_size=3),
    st.complex_numbers(),
)
names = st.one_of(
    st.text(max_size=20),
    st.text(min_size=200, max_size=400),
    st.sampled_from(["rank", "Rank", "RANK", "step", "time", "duration_s", "_rowid", "rowid", "oid", "n",
                     "bucket", "loss__min", "x__max", 'a"b', "a b", "naïve", "损失", "", "1st", "-", "\x00"]),
)
steps = st.lists(st.dictionaries(names, values, max_size=6), min_size=1, max_size=6)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_any_logged_value_leaves_a_readable_complete_run(rows: list[dict[str, Any]]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpudash-values-"))
    try:
        mon = Monitor(tmp / "run", handle_signals=False, flush_interval=0.05)
        for i, scalars in enumerate(rows):
            with mon.step():
                mon.log(**scalars)
                mon.log(marker=float(i))
        assert mon.flush()
        assert mon.recorder._thread.is_alive()
        assert mon.recorder.dropped == 0
        mon.close()
        run = gpudash.load_run(tmp / "run")
        assert run.status == "finished"
        assert run.problems == []
        assert list(run.steps["step"]) == list(range(len(rows)))
        assert list(run.steps["marker"]) == [float(i) for i in range(len(rows))]
        reader = run._reader
        assert reader is not None
        live, _ = reader.read_since(None)
        assert len(live["steps"]) == len(rows)
        run.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True),
                 st.booleans()))
def test_a_number_reads_back_as_itself(x: Any) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpudash-values-"))
    try:
        mon = Monitor(tmp / "run", handle_signals=False, flush_interval=0.05)
        for v in (x, np.float64(x) if not isinstance(x, bool) else np.bool_(x), torch.tensor(x)):
            with mon.step():
                mon.log(value=v)
        mon.close()
        got = gpudash.load_run(tmp / "run").steps["value"].tolist()
        assert len(got) == 3
        for g, want in zip(got, (float(x), float(np.float64(x)), float(torch.tensor(x).item())), strict=True):
            assert (math.isnan(g) and math.isnan(want)) or g == want
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_values_that_cannot_be_stored_are_counted_and_named(tmp_path: Path) -> None:
    with Monitor(tmp_path / "run", handle_signals=False, flush_interval=0.05) as mon:
        with mon.step():
            mon.log(too_big=10**400, vector=torch.ones(3), ok=1.5, tokens_seen=2**64)
        mon.flush()
        rec = mon.recorder
        assert rec.dropped_values == 2
        assert any("too_big" in e and "bits" in e for e in rec.errors)
        assert any("vector" in e and "log one number" in e for e in rec.errors)
    steps = gpudash.load_run(tmp_path / "run").steps
    assert steps["ok"].tolist() == [1.5] and steps["tokens_seen"].tolist() == [float(2**64)]
    assert steps["too_big"].isna().all() and steps["vector"].isna().all()


def _reach_oldest_generation_per_step(tmp: Path, value: Any, steps: int = 2000) -> float:
    """Objects per step that the hot path leaves for the oldest GC generation: records wait in the
    buffer until the writer's next flush, long enough to be promoted in a fast loop."""
    import gc

    # writer waits; no leak watch: its thread's reads (every 16 steps) would be counted as the hot path's
    mon = Monitor(tmp, handle_signals=False, flush_interval=600.0, host_hz=0, device_hz=0, leak_poll_s=0)
    mon.recorder.flush_rows = 1 << 30  # nor woken by queued rows: its flushes' own objects are not the hot path's
    model = torch.nn.Linear(4, 4)
    mon.watch(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def one(i: int) -> None:
        with mon.step(samples=8, tokens=64):
            with mon.phase("forward"):
                pass
            mon.log(loss=value(i), lr=1e-3)
            mon.log_memory(offload_bytes=i)

    for i in range(20):
        one(i)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects(2))
        for i in range(steps):
            one(i)
        gc.collect(1)  # what survives the young generations moves to the oldest
        promoted = len(gc.get_objects(2)) - before
    finally:
        if enabled:
            gc.enable()
    mon.close()
    return promoted / steps


def test_hot_path_leaves_nothing_for_the_oldest_gc_generation(tmp_path: Path) -> None:
    # rows of numbers are dicts the GC does not track; no (table, row) tuple wraps them in the buffer
    assert _reach_oldest_generation_per_step(tmp_path / "a", lambda i: 1.0 / (i + 1)) < 0.05
    # a tensor must wait for the writer (reading it would wait for the GPU): the tensor and its row only
    t = torch.tensor(2.0)
    assert _reach_oldest_generation_per_step(tmp_path / "b", lambda i: t * 1.0) < 2.05
