"""Allocator columns per step, from ``torch.cuda.memory_stats()``-shaped dicts.

No GPU here: the source below hands out dicts with the key names
``torch.cuda.memory_stats()`` uses (documented in torch.cuda.memory_stats);
a GPU run (issue 7) exercises TorchAllocatorSource itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpudash
from gpudash.collectors.allocator import AllocatorCollector, allocator_row, device_row

MiB = 1 << 20


def stats(step: int) -> dict[str, Any]:
    alloc = (100 + 10 * step) * MiB
    return {
        "allocated_bytes.all.current": alloc, "allocated_bytes.all.peak": alloc + 50 * MiB,
        "reserved_bytes.all.current": 400 * MiB, "reserved_bytes.all.peak": 400 * MiB,
        "active_bytes.all.current": alloc + MiB, "active_bytes.all.peak": alloc + 51 * MiB,
        "inactive_split_bytes.all.current": 20 * MiB, "requested_bytes.all.current": alloc - 3 * MiB,
        "num_alloc_retries": step // 4, "num_ooms": 0, "num_device_alloc": 7, "num_device_free": 2,
        "allocation.all.current": 12,
    }


class StatsSource:
    """Hands out one stats dict per read; counts resets and device-info reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.resets = 0
        self.infos = 0

    def memory_stats(self) -> dict[str, Any]:
        self.reads += 1
        return stats(self.reads - 1)

    def reset_peaks(self) -> None:
        self.resets += 1

    def mem_get_info(self) -> tuple[int, int]:
        self.infos += 1
        return 1000 * MiB, 4000 * MiB


def test_allocator_row() -> None:
    row = allocator_row(stats(2))
    assert row["allocated_bytes"] == 120 * MiB and row["allocated_peak_bytes"] == 170 * MiB
    assert row["peak_bytes"] == 170 * MiB  # the step's measured peak, under the name every surface reads
    assert row["reserved_unallocated_bytes"] == 280 * MiB
    assert row["fragmentation_pct"] == 5.0
    assert row["alloc_retries"] == 0 and row["cuda_mallocs"] == 7
    assert allocator_row({}) == {}
    assert device_row(1000, 4000, reserved=2500) == {"device_free_bytes": 1000, "device_total_bytes": 4000,
                                                      "device_used_bytes": 3000, "non_pytorch_bytes": 500}


def test_memory_rows_reconcile_with_categories(tmp_path: Path, train_tiny: Any) -> None:
    import torch

    from gpudash.monitor import Monitor

    src = StatsSource()
    model = torch.nn.Linear(8, 8)
    with Monitor(tmp_path / "r", host_hz=0, allocator=False) as m:
        m.add_collector(AllocatorCollector(src, device_info_interval=3600))
        m.watch(model)
        for _ in range(5):
            with m.step():
                model(torch.randn(2, 8)).sum().backward()
        try:
            with m.step():
                raise RuntimeError("a failed step reads nothing")
        except RuntimeError:
            pass
    mem = gpudash.load_run(tmp_path / "r").memory
    assert src.reads == src.resets == 5 and src.infos == 1
    assert mem["allocated_bytes"].tolist() == [(100 + 10 * i) * MiB for i in range(5)]
    assert mem["device_used_bytes"].notna().sum() == 1
    cats = [c for c in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes") if c in mem]
    known = mem[cats].sum(axis=1)
    # the categories describe the step's peak: "other" is the rest of that peak (temporaries...),
    # on the steps whose activations were measured
    whole = mem["activations_bytes"].notna()
    assert whole.any() and (mem.loc[whole, "other_bytes"] == mem.loc[whole, "peak_bytes"] - known[whole]).all()
    assert mem.loc[~whole, "other_bytes"].isna().all()
    assert mem["alloc_retries"].tolist() == [0, 0, 0, 0, 1]


def test_uninitialised_cuda_reads_nothing(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    class Empty(StatsSource):
        def memory_stats(self) -> dict[str, Any]:
            return {}

    src = Empty()
    with Monitor(tmp_path / "r", host_hz=0, allocator=False) as m:
        m.add_collector(AllocatorCollector(src))
        with m.step():
            pass
    assert src.infos == 0 and src.resets == 0  # mem_get_info would create a CUDA context


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``torch.cuda.memory_stats_as_nested_dict()``'s shape of a flat stats dict (torch joins the levels with a
    dot to flatten them)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


class _Cuda:
    def __init__(self, nested: Any = None) -> None:
        self.flat_reads = 0
        if nested is not None:
            self.memory_stats_as_nested_dict = nested

    def memory_stats(self) -> dict[str, Any]:
        self.flat_reads += 1
        return stats(2)


def test_the_row_is_read_from_the_nested_stats_without_flattening_them() -> None:
    from types import SimpleNamespace

    from gpudash.collectors.allocator import TorchAllocatorSource

    cuda = _Cuda(lambda: nest(stats(2)))
    src = TorchAllocatorSource(SimpleNamespace(cuda=cuda))
    assert allocator_row(src.memory_stats()) == allocator_row(stats(2))
    assert cuda.flat_reads == 0  # memory_stats() flattens and sorts every key in Python: never called
    assert TorchAllocatorSource(SimpleNamespace(cuda=_Cuda(lambda: {}))).memory_stats() == {}  # CUDA not started


def test_a_torch_without_the_nested_stats_or_with_another_layout_falls_back() -> None:
    from types import SimpleNamespace

    from gpudash.collectors.allocator import TorchAllocatorSource

    old = _Cuda()  # no memory_stats_as_nested_dict
    assert allocator_row(TorchAllocatorSource(SimpleNamespace(cuda=old)).memory_stats()) == allocator_row(stats(2))

    def broken() -> dict[str, Any]:
        raise RuntimeError("another layout")

    cuda = _Cuda(broken)
    src = TorchAllocatorSource(SimpleNamespace(cuda=cuda))
    assert allocator_row(src.memory_stats()) == allocator_row(stats(2))
    src.memory_stats()
    assert cuda.flat_reads == 2  # the nested read is not tried again after it failed
