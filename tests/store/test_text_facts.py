"""A text fact gpudash writes is one its reader takes: a crashed run's end reason past 1,000 characters (torch's
OOM message on a GPU shared by many processes, as recorded on an H200) is stored with its start and its end, and
the run reads back without a problem."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import gpudash
from gpudash.store.meta import TEXT_FACT_CHARS, fit_text
from gpudash.store.writer import Recorder

#: the shape of the message recorded on the H200 (sample_runs/gpu-oom-crash): the processes first, this one's
#: own numbers last
OOM = ("out of memory at micro-batch 1: CUDA out of memory. Tried to allocate 176.00 MiB. GPU 0 has a total "
       "capacity of 139.80 GiB of which 84.97 GiB is free. "
       + " ".join(f"Process {500 + i} has {i}.05 GiB memory in use." for i in range(30))
       + " 1.50 GiB allowed; Of the allocated memory 1.35 GiB is allocated by PyTorch, and 87.59 MiB is reserved by "
         "PyTorch but unallocated.")


def test_a_long_end_reason_is_stored_with_its_start_and_end(tmp_path: Path) -> None:
    assert len(OOM) > TEXT_FACT_CHARS
    rec = Recorder(tmp_path, flush_interval=60)
    rec.put_meta(host="h" * 5000)
    rec.close("crashed", OOM)
    run = gpudash.load_run(tmp_path)
    assert run.problems == []
    reason = run.meta["end_reason"]
    assert len(reason) <= TEXT_FACT_CHARS
    assert reason.startswith("out of memory at micro-batch 1: CUDA out of memory. Tried to allocate 176.00 MiB")
    assert reason.endswith("87.59 MiB is reserved by PyTorch but unallocated.")
    run.close()


@given(st.text(max_size=3000), st.integers(min_value=10, max_value=2000))
def test_fit_text_keeps_short_texts_and_bounds_long_ones(text: str, limit: int) -> None:
    out = fit_text(text, limit)
    if len(text) <= limit:
        assert out == text
    else:
        assert len(out) == limit
        head = (limit - 3) * 3 // 5
        assert out[:head] == text[:head] and out[head:head + 3] == " … "
        assert out[head + 3:] == text[len(text) - (limit - 3 - head):]
