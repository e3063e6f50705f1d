"""Host memory by process: a child holding N MB shows apart from the main process, slots, the rescan bound."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpudash.collectors.procmem import ProcMem, shm_used
from gpudash.monitor import Monitor

HOLD = 48 * 2**20
_CHILD = ("import sys; b = b'\\x01' * int(sys.argv[1]); print('ready', flush=True); sys.stdin.read()")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="USS/PSS from /proc are Linux's")


def _hold(nbytes: int) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(nbytes)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _end(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    child.wait(30)


def _slot_of(row: dict[str, float], pid: int) -> int:
    return next(int(k[5:-4]) for k, v in row.items() if k.startswith("child") and k.endswith("_pid") and v == pid)


def test_a_child_holding_memory_shows_apart_from_the_main_process() -> None:
    pm = ProcMem(psutil.Process())
    child = _hold(HOLD)
    try:
        row = pm.sample(now=0.0)
        slot = _slot_of(row, child.pid)
        assert row[f"child{slot}_uss_bytes"] >= 0.9 * HOLD
        assert row[f"child{slot}_pss_bytes"] >= row[f"child{slot}_uss_bytes"]
        assert row["children"] >= 1 and row["children_uss_bytes"] >= row[f"child{slot}_uss_bytes"]
        assert 0 < row["main_uss_bytes"] <= row["main_pss_bytes"]
        # PSS adds up: over the processes it lies between the unique bytes and the resident ones
        procs = [psutil.Process()] + [psutil.Process(int(v)) for k, v in row.items() if k.endswith("_pid")]
        rss = sum(p.memory_info().rss for p in procs)
        pss = row["main_pss_bytes"] + row["children_pss_bytes"]
        assert row["main_uss_bytes"] + row["children_uss_bytes"] <= pss <= 1.05 * rss
    finally:
        _end(child)
    after = pm.sample(now=1.0)  # the exited child is dropped at its next read, its slot freed
    assert f"child{slot}_pid" not in after or after[f"child{slot}_pid"] != child.pid


def test_children_are_listed_at_most_every_rescan_and_slots_are_reused() -> None:
    pm = ProcMem(psutil.Process(), rescan_s=5.0)
    pm.sample(now=0.0)
    child = _hold(2**20)
    try:
        assert child.pid not in {int(v) for k, v in pm.sample(now=1.0).items() if k.endswith("_pid")}
        row = pm.sample(now=6.0)  # past the rescan interval: found
        first = _slot_of(row, child.pid)
    finally:
        _end(child)
    pm.sample(now=7.0)
    again = _hold(2**20)
    try:
        row = pm.sample(now=12.0)
        assert _slot_of(row, again.pid) == first  # the next process takes the freed slot
    finally:
        _end(again)


def test_slots_are_bounded_and_the_sums_count_every_child() -> None:
    pm = ProcMem(psutil.Process(), max_slots=1)
    kids = [_hold(2**20) for _ in range(2)]
    try:
        row = pm.sample(now=0.0)
        assert sum(k.endswith("_pid") for k in row) == 1
        assert row["children"] >= 2
        assert row["children_pss_bytes"] > row["child0_pss_bytes"]
    finally:
        for k in kids:
            _end(k)


def test_shm_reads_a_mount_and_says_none_for_a_missing_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(shm_used(str(tmp_path)), int)
    assert shm_used(str(tmp_path / "missing")) is None
    assert "shm_used_bytes" not in ProcMem(psutil.Process(), shm_root=str(tmp_path / "missing")).sample(now=0.0)


def test_the_host_thread_records_the_children_and_the_facts_name_them(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import time

    import gpudash
    from gpudash.analysis.facts import run_facts
    from gpudash.monitor import Monitor

    child = _hold(HOLD)
    try:
        with Monitor(tmp_path / "w", host_hz=20, handle_signals=False, flush_interval=0.05) as mon:
            for _ in range(30):  # ~1.5 s: samples at 20 Hz
                with mon.step():
                    time.sleep(0.05)
    finally:
        _end(child)
    run = gpudash.load_run(tmp_path / "w")
    try:
        h = run_facts(run).host_memory
        assert h is not None and h.workers >= 1
        assert max(v for k, v in h.peak_pss_bytes.items() if k.startswith("worker")) >= 0.9 * HOLD
        assert h.peak_pss_bytes["main"] > 0 and h.min_available_bytes
    finally:
        run.close()
    # every surface states the one fact: info, the report, /metrics
    from prometheus_client import generate_latest

    from gpudash.analysis.hostmem import host_memory_text
    from gpudash.cli import main
    from gpudash.server.metrics import metrics_registry

    line = host_memory_text(h)
    assert main(["info", str(tmp_path / "w")]) == 0
    assert line in capsys.readouterr().out
    main(["report", str(tmp_path / "w"), "--format", "md", "-o", str(tmp_path / "r.md")])
    assert line in (tmp_path / "r.md").read_text()
    text = generate_latest(metrics_registry(tmp_path)).decode()
    gauge = next(ln for ln in text.splitlines() if ln.startswith("gpudash_host_memory_peak_pss_bytes{"))
    assert float(gauge.rsplit(" ", 1)[1]) == h.peak_total_pss_bytes



def test_oom_kills_counted_from_the_sampler_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpudash.collectors.procmem import oom_kill_count

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 10\noom_kill 3\n")
    pm = ProcMem(psutil.Process(), vmstat=str(vmstat))
    assert pm.sample(now=0.0)["oom_kills"] == 0
    vmstat.write_text("pgfault 12\noom_kill 5\n")
    assert pm.sample(now=1.0)["oom_kills"] == 2
    assert oom_kill_count(str(tmp_path / "none")) is None
    assert "oom_kills" not in ProcMem(psutil.Process(), vmstat=str(tmp_path / "none")).sample(now=0.0)


def test_pinned_memory_on_cpu_is_a_reported_state_said_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    from gpudash import load_run
    from gpudash.analysis.hostmem import host_memory_text, run_host_memory
    from gpudash.collectors.procmem import NO_CUDA, open_pinned
    from gpudash.monitor import Monitor

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: pinned memory is measured (the device pack checks it)")
    assert open_pinned() == (None, NO_CUDA)
    with Monitor(tmp_path / "r", host_hz=50, handle_signals=False, flush_interval=0.05) as mon:
        for _ in range(3):
            with mon.step():
                time.sleep(0.03)
    run = load_run(tmp_path / "r")
    assert run.meta["unavailable_pinned_memory"] == NO_CUDA
    assert "pinned_bytes" not in run.host  # no silent zero
    h = run_host_memory(run)
    assert h is not None and h.pinned_peak_bytes is None
    assert host_memory_text(h).count(NO_CUDA) == 1


def test_pinned_memory_from_the_allocator_stats_is_recorded_and_shown(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake ``torch.cuda.host_memory_stats`` (flat keys, as torch 2.5+ returns them): the host rows carry it,
    the headline and the dashboard's by-process panel show it."""
    from gpudash import load_run
    from gpudash.analysis.hostmem import host_memory_text, run_host_memory
    from gpudash.collectors import procmem
    from gpudash.monitor import Monitor
    from gpudash.server.layouts.device import host_series

    held = {"allocated_bytes.current": 512 * 2**20, "active_bytes.current": 384 * 2**20, "allocations.current": 3}
    monkeypatch.setattr(procmem, "open_pinned", lambda: (procmem.pinned_reader(lambda: dict(held)), None))
    assert procmem.pinned_reader(lambda: held)() == {"pinned_bytes": 512 * 2**20, "pinned_active_bytes": 384 * 2**20}
    with Monitor(tmp_path / "r", host_hz=50, handle_signals=False, flush_interval=0.05) as mon:
        for _ in range(3):
            with mon.step():
                time.sleep(0.03)
    run = load_run(tmp_path / "r")
    assert "unavailable_pinned_memory" not in run.meta
    assert set(run.host["pinned_bytes"].dropna()) == {512 * 2**20}
    h = run_host_memory(run)
    assert h is not None and h.pinned_peak_bytes == 512 * 2**20
    assert "pinned up to 512.0 MiB" in host_memory_text(h)
    assert "pinned_bytes" in {s.col for s in host_series(run.host)}


class _Corpus:
    """``nbytes`` of 4 KiB Python ``bytes`` objects in a list (a tokenized corpus held in memory): each worker's
    reads touch every object's reference count, so copy-on-write gives each worker its own copy."""

    def __init__(self, nbytes: int) -> None:
        self.items = [bytes([i % 251]) * 4096 for i in range(nbytes // 4096)]

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> int:
        return sum(len(b) for b in self.items)


@pytest.mark.slow
def test_dataloader_workers_each_holding_a_copy_show_apart_from_the_main_process(tmp_path: Path) -> None:
    """Two forked DataLoader workers over a 20 MB in-memory corpus, under a Monitor sampling the host: each
    worker's peak PSS holds its copy, the main process's holds the original, and the headline names them apart."""
    pytest.importorskip("torch")
    import torch.utils.data as tud

    from gpudash import load_run
    from gpudash.analysis.hostmem import host_memory_text, run_host_memory

    mb = 20 * 10**6
    corpus = _Corpus(mb)
    loader = tud.DataLoader(corpus, batch_size=1, num_workers=2, persistent_workers=True, prefetch_factor=1,
                            multiprocessing_context="fork")
    with Monitor(tmp_path / "r", host_hz=20, handle_signals=False, flush_interval=0.05) as mon:
        it = iter(loader)
        deadline = time.monotonic() + 60  # until both workers' copies were sampled (a loaded machine is slow)
        while time.monotonic() < deadline:
            with mon.step():
                next(it)
                time.sleep(0.05)
            mon.flush()
            h = run_host_memory(load_run(tmp_path / "r"))
            if h is not None and all(h.peak_pss_bytes.get(f"worker {i}", 0) >= 0.8 * mb for i in (0, 1)):
                break
        del it
    h = run_host_memory(load_run(tmp_path / "r"))
    assert h is not None and h.workers == 2, h
    assert h.peak_pss_bytes["main"] >= mb
    assert all(h.peak_pss_bytes[f"worker {i}"] >= 0.8 * mb for i in (0, 1)), h.peak_pss_bytes
    assert h.peak_total_pss_bytes is not None and h.peak_total_pss_bytes >= 2.6 * mb
    assert "worker 0" in host_memory_text(h) and "worker 1" in host_memory_text(h)
