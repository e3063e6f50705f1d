"""NVML device telemetry, tested by replaying a recording of raw NVML readings.

Each test runs on two recordings in the same format: the SYNTHETIC nvml_recording_synthetic.json (failing and
unsupported readings on purpose) and tests/fixtures/nvml_recording_h200.json, recorded on an NVIDIA H200 by the
device pack (record_nvml, 20 Hz, 5 s; the GPU was nearly idle: utilization <= 4 %). Expected values are computed
from the recording itself.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.collectors.device import (
    PCIE_EVERY_S,
    PCIE_VIA_GPM,
    DeviceCollector,
    DeviceSampler,
    readings_to_row,
    record_nvml,
    resolve_nvml_index,
)
from gpudash.collectors.nvml import (
    GPM_COLUMNS,
    GPM_PCIE,
    METRICS,
    PCIE_METRICS,
    DeviceSource,
    NvmlSource,
    RecordingSource,
    ReplaySource,
    Unsupported,
    nvml_call,
)
from gpudash.monitor import Monitor

FIXTURES = Path(__file__).parent.parent / "fixtures"
REAL = FIXTURES / "nvml_recording_h200.json"
RECORDINGS = [FIXTURES / "nvml_recording_synthetic.json", REAL]


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.stem)
def recording(request: pytest.FixtureRequest) -> dict[str, Any]:
    return json.loads(request.param.read_text())


def gpus_of(rec: dict[str, Any]) -> list[int]:
    return [int(g) for g in rec["probe"]]


def replay_all(rec: dict[str, Any]) -> tuple[DeviceSampler, list[dict[str, Any]]]:
    src = ReplaySource(rec)
    sampler = DeviceSampler(src, gpus_of(rec), pid=rec.get("pid"))
    sampler.probe()
    rows: list[dict[str, Any]] = []
    while not src.exhausted:
        rows += sampler.sample()
    return sampler, rows


def test_replay_turns_every_reading_into_unit_columns(recording: dict[str, Any]) -> None:
    sampler, rows = replay_all(recording)
    gpu = gpus_of(recording)[0]
    assert len(rows) == len(recording["ticks"]) * len(gpus_of(recording))
    ok = [m for m, s in recording["probe"][str(gpu)].items() if s == "ok"]
    via_gpm = PCIE_METRICS if "gpm" in ok else ()  # the blocking legacy PCIe call is not made where GPM answers
    assert sampler.supported[gpu] == [m for m in METRICS if m in ok and m not in via_gpm]
    assert {m: sampler.unsupported[gpu][m] for m in via_gpm} == dict.fromkeys(via_gpm, PCIE_VIA_GPM)
    for tick, row in zip(recording["ticks"], [r for r in rows if r["gpu"] == gpu], strict=True):
        raw = tick["gpus"][str(gpu)]
        assert row["time"] == tick["t"]
        if "power" in raw:
            assert row["power_w"] == pytest.approx(raw["power"] / 1000)
        if via_gpm:
            rx = raw["gpm"].get(str(GPM_PCIE["pcie_rx"])) if isinstance(raw.get("gpm"), dict) else None
            if rx is not None and math.isfinite(rx):
                assert row["pcie_rx_mib_s"] == pytest.approx(rx)
            else:
                assert "pcie_rx_mib_s" not in row
        elif "pcie_rx" in row:  # read once per PCIE_EVERY_S
            assert row["pcie_rx_mib_s"] == pytest.approx(raw["pcie_rx"] / 1024)
        if "utilization" in raw:
            assert (row["gpu_util_pct"], row["mem_util_pct"]) == tuple(raw["utilization"])
        if "memory" in raw:
            assert row["memory_used_bytes"] == raw["memory"][1]
        if "temperature" in raw:
            assert row["temp_c"] == raw["temperature"]
        if "sm_clock" in raw:
            assert row["sm_clock_mhz"] == raw["sm_clock"]
        if "clock_events" in raw:
            assert row["throttle_mask"] == raw["clock_events"]
            assert row["throttle_power"] == int(bool(raw["clock_events"] & 0x84))
        if isinstance(raw.get("processes"), list):
            mine = sum(b for p, b in raw["processes"] if p == recording.get("pid") and b is not None)
            assert row["process_memory_bytes"] == mine
            assert row["processes"] == len(raw["processes"])
        elif "processes" in raw:  # a failed reading: no value this tick, metric kept
            assert "processes" not in row
        if isinstance(raw.get("gpm"), dict):
            for mid, col in GPM_COLUMNS.items():
                if str(mid) in raw["gpm"]:
                    # GPM can answer NaN (the H200 recording: DRAM bandwidth of its first pair)
                    assert row[col] == pytest.approx(raw["gpm"][str(mid)], nan_ok=True)
    assert "processes" in sampler.supported[gpu]  # one error does not drop a metric


def test_unsupported_metrics_are_probed_once_and_never_read(recording: dict[str, Any]) -> None:
    rec = copy.deepcopy(recording)
    gpu = str(gpus_of(rec)[0])
    rec["probe"][gpu]["gpm"] = "not supported: GPM needs a Hopper or newer GPU"
    rec["probe"][gpu]["energy"] = "not supported: not supported"
    reads: list[str] = []

    class Counting(ReplaySource):
        def read(self, g: int, metric: str) -> Any:
            reads.append(metric)
            return super().read(g, metric)

    src = Counting(rec)
    sampler = DeviceSampler(src, [int(gpu)], pid=rec.get("pid"))
    sampler.probe()
    assert sampler.unsupported[int(gpu)]["gpm"].startswith("not supported")
    reads.clear()
    rows = [sampler.sample()[0] for _ in range(5)]
    assert "gpm" not in reads and "energy" not in reads
    assert not any(c in r for r in rows for c in GPM_COLUMNS.values())
    assert all("power_w" in r for r in rows)


def test_a_metric_that_keeps_failing_is_dropped(recording: dict[str, Any]) -> None:
    rec = copy.deepcopy(recording)
    gpu = str(gpus_of(rec)[0])
    for t in rec["ticks"]:
        t["gpus"][gpu]["temperature"] = {"error": "NVMLError_GpuIsLost: GPU is lost"}
    src = ReplaySource(rec)
    sampler = DeviceSampler(src, [int(gpu)], max_failures=3)
    sampler.probe()
    rows = [sampler.sample()[0] for _ in range(6)]
    assert "temperature" not in sampler.supported[int(gpu)]
    assert sampler.dropped and "GPU is lost" in sampler.dropped[0]
    assert all("temp_c" not in r and "power_w" in r for r in rows)


def test_device_collector_writes_the_device_table(tmp_path: Path, recording: dict[str, Any]) -> None:
    gpu = gpus_of(recording)[0]
    col = DeviceCollector(hz=200, source_factory=lambda: ReplaySource(recording), gpus=[gpu])
    with Monitor(tmp_path / "r", host_hz=0, device_hz=0) as m:
        m.add_collector(col)
        deadline = time.monotonic() + 20
        while col.samples < len(recording["ticks"]) and time.monotonic() < deadline:
            time.sleep(0.02)
    run = gpudash.load_run(tmp_path / "r")
    dev = run.device
    assert len(dev) == len(recording["ticks"])
    assert set(dev["gpu"]) == {gpu} and set(dev["rank"]) == {0}
    for c in ("power_w", "temp_c", "pcie_tx_mib_s", "sm_clock_mhz", "gpu_util_pct"):
        assert c in dev, c
    assert dev["time"].is_monotonic_increasing
    assert run.meta["device_gpus"] == [gpu]
    assert "power" in run.meta["device_metrics"][str(gpu)]
    if "gpm" in run.meta["device_metrics"][str(gpu)]:  # PCIe from GPM, and the meta says why
        assert run.meta["device_unsupported"][str(gpu)]["pcie_tx"] == PCIE_VIA_GPM
    assert not any(e == "collector_unavailable" and "device" in str(d)
                   for e, d in zip(run.events["kind"], run.events["data"], strict=True))


def test_readings_to_row_tolerates_missing_pid() -> None:
    row = readings_to_row({"processes": [[1, None], [2, 100]]}, pid=None)
    assert row == {"processes": 2, "other_processes_memory_bytes": 100}


def test_no_nvml_here_is_unsupported_not_an_error(tmp_path: Path) -> None:
    try:
        NvmlSource().close()
    except Unsupported as exc:
        reason = str(exc)
    else:
        pytest.skip("NVML is present on this machine")
    with pytest.raises(Unsupported):
        record_nvml(tmp_path / "rec.json", seconds=0.1)
    with Monitor(tmp_path / "r", host_hz=0):
        pass
    ev = gpudash.load_run(tmp_path / "r").events
    msgs = ev.loc[ev["kind"] == "collector_unavailable", "message"].tolist()
    assert [mm for mm in msgs if mm.startswith("device:")] == [f"device: NVML: {reason}"]


def test_nvml_call_maps_not_supported_codes() -> None:
    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    for code in (3, 6, 13, 4):
        def fail(code: int = code) -> None:
            raise NVMLError(code)

        with pytest.raises(Unsupported):
            nvml_call(fail)

    def other() -> None:
        raise NVMLError(999)

    with pytest.raises(NVMLError):
        nvml_call(other)
    assert nvml_call(lambda x: x + 1, 1) == 2


def test_recording_source_round_trips_through_replay(recording: dict[str, Any]) -> None:
    rec_src = RecordingSource(ReplaySource(recording))
    gpus = gpus_of(recording)
    sampler = DeviceSampler(rec_src, gpus, pid=recording.get("pid"))
    sampler.probe()
    first = [sampler.sample() for _ in range(5)]
    again = rec_src.recording(hz=recording.get("hz"))
    # where GPM answers the legacy PCIe pair is not even probed, so the new recording has no word of it
    assert again["probe"] == {g: {m: s for m, s in p.items() if m in METRICS
                                  and not (m in PCIE_METRICS and p.get("gpm") == "ok")}
                              for g, p in recording["probe"].items()}
    replay = DeviceSampler(ReplaySource(json.loads(json.dumps(again))), gpus, pid=recording.get("pid"))
    replay.probe()
    assert [replay.sample() for _ in range(5)] == first


# ---- PCIe: from GPM where it answers, else the blocking legacy call at most once a second ---------------
class Counting:
    """Wraps a source; keeps every read asked of it as (tick time or None while probing, gpu, metric)."""

    def __init__(self, inner: DeviceSource) -> None:
        self.inner = inner
        self.t: float | None = None
        self.reads: list[tuple[float | None, int, str]] = []

    def devices(self) -> list[dict[str, Any]]:
        return self.inner.devices()

    def tick(self) -> float:
        self.t = self.inner.tick()
        return self.t

    def read(self, gpu: int, metric: str) -> Any:
        self.reads.append((self.t, gpu, metric))
        return self.inner.read(gpu, metric)

    def close(self) -> None:
        self.inner.close()

    def pcie_times(self, gpu: int, metric: str = "pcie_tx") -> list[float | None]:
        return [t for t, g, m in self.reads if g == gpu and m == metric]


def replay_counting(rec: dict[str, Any], **kw: Any) -> tuple[DeviceSampler, Counting, list[dict[str, Any]]]:
    src = Counting(ReplaySource(rec))
    sampler = DeviceSampler(src, gpus_of(rec), pid=rec.get("pid"), **kw)
    sampler.probe()
    rows: list[dict[str, Any]] = []
    while not src.inner.exhausted:  # type: ignore[attr-defined]
        rows += sampler.sample()
    return sampler, src, rows


def without(raw: dict[str, Any], *metrics: str) -> dict[str, Any]:
    """A tick's readings less ``metrics`` and the failed ones (those the sampler gets no value for)."""
    return {k: v for k, v in raw.items()
            if k not in metrics and not (isinstance(v, dict) and set(v) == {"error"})}


def due_times(times: list[float], every: float = PCIE_EVERY_S) -> list[float]:
    out: list[float] = []
    for t in times:
        if not out or t < out[-1] or t - out[-1] >= every:
            out.append(t)
    return out


def test_with_gpm_pcie_comes_from_gpm_and_the_legacy_call_is_never_made(recording: dict[str, Any]) -> None:
    gpus = gpus_of(recording)
    assert all(recording["probe"][str(g)]["gpm"] == "ok" for g in gpus)
    sampler, src, rows = replay_counting(recording)
    assert not [r for r in src.reads if r[2] in PCIE_METRICS]  # not at probe, not while sampling
    for g in gpus:
        assert not set(PCIE_METRICS) & set(sampler.supported[g])
        assert {m: sampler.unsupported[g][m] for m in PCIE_METRICS} == dict.fromkeys(PCIE_METRICS, PCIE_VIA_GPM)
    pid = recording.get("pid")
    for g in gpus:
        for tick, row in zip(recording["ticks"], [r for r in rows if r["gpu"] == g], strict=True):
            raw = tick["gpus"][str(g)]
            expected = {**readings_to_row(without(raw, *PCIE_METRICS), pid), "time": tick["t"], "gpu": g}
            assert row == pytest.approx(expected, nan_ok=True)  # every other column as before
            gpm = raw.get("gpm") if isinstance(raw.get("gpm"), dict) else {}
            for key, mid in GPM_PCIE.items():
                v = gpm.get(str(mid))
                if v is not None and math.isfinite(v):
                    assert row[f"{key}_mib_s"] == pytest.approx(v) == row[f"gpm_{key}_mib_s"]
                else:
                    assert f"{key}_mib_s" not in row
    assert sum("pcie_tx_mib_s" in r for r in rows) >= len(rows) // 2


def test_without_gpm_the_legacy_pcie_pair_is_read_at_most_once_a_second(recording: dict[str, Any]) -> None:
    rec = copy.deepcopy(recording)
    for p in rec["probe"].values():
        p["gpm"] = "not supported: GPM needs a Hopper or newer GPU"
    sampler, src, rows = replay_counting(rec)
    times = [float(t["t"]) for t in rec["ticks"]]
    expected = due_times(times)
    assert len(expected) >= 2 and len(expected) <= (times[-1] - times[0]) / PCIE_EVERY_S + 1
    pid = rec.get("pid")
    for g in gpus_of(rec):
        assert "pcie_tx" in sampler.supported[g] and "pcie_tx" not in sampler.unsupported[g]
        for metric in PCIE_METRICS:
            assert src.pcie_times(g, metric) == [None, *expected]  # once at probe, then once a second
        for tick, row in zip(rec["ticks"], [r for r in rows if r["gpu"] == g], strict=True):
            raw = tick["gpus"][str(g)]
            base = {**readings_to_row(without(raw, *PCIE_METRICS, "gpm"), pid), "time": tick["t"], "gpu": g}
            if tick["t"] in expected:
                assert row["pcie_tx_mib_s"] == pytest.approx(raw["pcie_tx"] / 1024)
                assert row["pcie_rx_mib_s"] == pytest.approx(raw["pcie_rx"] / 1024)
                base.update(pcie_tx_mib_s=row["pcie_tx_mib_s"], pcie_rx_mib_s=row["pcie_rx_mib_s"])
            assert row == pytest.approx(base, nan_ok=True)  # the rows between simply lack PCIe


def small_recording() -> dict[str, Any]:
    """GPU 0 with GPM, GPU 1 without; ticks at uneven times, the wall clock set back once (t=101.5)."""
    times = [100.0, 100.3, 100.99, 101.0, 101.2, 102.5, 102.6, 101.5, 101.6, 104.0]
    ok = dict.fromkeys(METRICS, "ok")
    probe = {"0": {**ok, "pcie_tx": "ok", "pcie_rx": "ok"}, "1": {**ok, "gpm": "not supported: GPM needs Hopper"}}
    ticks = []
    for i, t in enumerate(times):
        gpm: dict[str, float] | None = {"2": 50.0, "20": 10.0 * i, "21": float("nan") if i == 4 else 2.0 * i}
        ticks.append({"t": t, "gpus": {
            "0": {"power": 100_000 + i, "pcie_tx": 1024, "pcie_rx": 2048, "gpm": None if i == 0 else gpm},
            "1": {"power": 200_000 + i, "pcie_tx": 1024 * (i + 1), "pcie_rx": 512 * (i + 1)}}})
    return {"format": "gpudash-nvml-recording", "version": 1, "synthetic": True, "pid": 7, "hz": 10.0,
            "devices": [{"index": 0}, {"index": 1}], "probe": probe, "ticks": ticks}


def test_pcie_on_a_small_hand_built_recording() -> None:
    rec = small_recording()
    sampler, src, rows = replay_counting(rec)
    assert src.pcie_times(0) == [] and src.pcie_times(0, "pcie_rx") == []
    # GPU 1: first tick, then >= 1 s later; the clock set back (101.5 < 102.5) reads again at once
    assert src.pcie_times(1) == [None, 100.0, 101.0, 102.5, 101.5, 104.0]
    assert src.pcie_times(1, "pcie_rx") == src.pcie_times(1)
    g0 = [r for r in rows if r["gpu"] == 0]
    g1 = [r for r in rows if r["gpu"] == 1]
    assert [r.get("pcie_tx_mib_s") for r in g0] == [None, *(10.0 * i for i in range(1, 10))]  # tick 0: GPM primes
    assert [r.get("pcie_rx_mib_s") for r in g0] == [None, 2.0, 4.0, 6.0, None, 10.0, 12.0, 14.0, 16.0, 18.0]
    assert math.isnan(g0[4]["gpm_pcie_rx_mib_s"]) and g0[3]["gpm_pcie_tx_mib_s"] == 30.0
    assert [r.get("pcie_tx_mib_s") for r in g1] == [1.0, None, None, 4.0, None, 6.0, None, 8.0, None, 10.0]
    assert [r.get("pcie_rx_mib_s") for r in g1] == [0.5, None, None, 2.0, None, 3.0, None, 4.0, None, 5.0]
    assert all(r["power_w"] == pytest.approx(100 + i / 1000) for i, r in enumerate(g0))
    assert not any(c in r for r in g1 for c in GPM_COLUMNS.values())
    # pcie_every_s=0: the legacy pair every tick (the old behaviour)
    _, src0, _ = replay_counting(small_recording(), pcie_every_s=0)
    assert src0.pcie_times(1) == [None, *(t["t"] for t in rec["ticks"])] and src0.pcie_times(0) == []


def test_a_dropped_gpm_brings_the_legacy_pcie_pair_back() -> None:
    rec = small_recording()
    for t in rec["ticks"][3:]:
        t["gpus"]["0"]["gpm"] = {"error": "NVMLError_Unknown: Unknown Error"}
    sampler, src, rows = replay_counting(rec, max_failures=2)
    assert any("gpu 0 gpm" in d for d in sampler.dropped)
    assert "gpm" not in sampler.supported[0] and "pcie_tx" in sampler.supported[0]
    assert "pcie_tx" not in sampler.unsupported[0]
    # gpm fails at ticks 3 and 4 (dropped at 4); the legacy pair from tick 5 (102.5) on, once a second
    assert src.pcie_times(0) == [102.5, 101.5, 104.0]
    g0 = [r for r in rows if r["gpu"] == 0]
    assert [r.get("pcie_tx_mib_s") for r in g0][5:] == [1.0, None, 1.0, None, 1.0]


def test_readings_to_row_pcie_legacy_first_then_gpm() -> None:
    gpm = {"20": 3.0, "21": float("nan")}
    assert readings_to_row({"pcie_tx": 2048, "gpm": gpm}) == {
        "pcie_tx_mib_s": 2.0, "gpm_pcie_tx_mib_s": 3.0, "gpm_pcie_rx_mib_s": pytest.approx(math.nan, nan_ok=True)}
    row = readings_to_row({"gpm": {20: 3.0, 21: 4.5}})
    assert (row["pcie_tx_mib_s"], row["pcie_rx_mib_s"]) == (3.0, 4.5)
    assert readings_to_row({"gpm": None}) == {}


# ---- CUDA device -> NVML device ---------------------------------------------------------------
DEVICES = [{"index": 0, "uuid": "GPU-aaaa1111-0000", "pci_bus_id": "00000000:19:00.0"},
           {"index": 1, "uuid": "GPU-bbbb2222-0000", "pci_bus_id": "00000000:3B:00.0"},
           {"index": 2, "uuid": "GPU-cccc3333-0000", "pci_bus_id": "00000001:5D:00.0"}]


@pytest.mark.parametrize(("cuda", "kw", "expected"), [
    (0, {}, 0),
    (1, {}, 1),
    (5, {}, None),
    (0, {"uuid": "bbbb2222-0000"}, 1),  # torch's props.uuid has no GPU- prefix
    (0, {"uuid": "GPU-CCCC3333-0000"}, 2),
    (0, {"pci": (0, 0x3B, 0)}, 1),
    (0, {"pci": (1, 0x5D, 0)}, 2),
    (0, {"visible": "2"}, 2),
    (1, {"visible": "2,0"}, 0),
    (0, {"visible": "GPU-bbbb"}, 1),
    (0, {"visible": "GPU-"}, None),  # ambiguous prefix
    (0, {"visible": "MIG-1234"}, None),
    (2, {"visible": "0,1"}, None),
    (0, {"visible": "1", "uuid": "GPU-cccc3333-0000"}, 2),  # the UUID torch reports wins
])
def test_resolve_nvml_index(cuda: int, kw: dict[str, Any], expected: int | None) -> None:
    assert resolve_nvml_index(DEVICES, cuda, **kw) == expected


def test_collector_samples_the_gpu_cuda_visible_devices_names(tmp_path: Path, recording: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Before CUDA is up the collector maps LOCAL_RANK through CUDA_VISIBLE_DEVICES."""
    rec = copy.deepcopy(recording)
    g = str(gpus_of(rec)[0])
    second = {**rec["devices"][0], "index": 1, "uuid": rec["devices"][0].get("uuid", "GPU-x") + "-b"}
    rec["devices"] = [rec["devices"][0], second]
    rec["probe"]["1"] = rec["probe"][g]
    for t in rec["ticks"]:
        t["gpus"]["1"] = t["gpus"][g]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    col = DeviceCollector(hz=200, source_factory=lambda: ReplaySource(rec))
    with Monitor(tmp_path / "r", host_hz=0, device_hz=0) as m:
        m.add_collector(col)
        deadline = time.monotonic() + 20
        while col.samples < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    run = gpudash.load_run(tmp_path / "r")
    assert set(run.device["gpu"]) == {1}
    assert run.meta["device_gpus"] == [1]
