"""NVML device telemetry, tested by replaying a recording of raw NVML readings.

The fixture is tests/fixtures/nvml_recording_h200.json when a real recording
exists (record_nvml on a GPU), else the SYNTHETIC nvml_recording_synthetic.json
in the same format. Expected values are computed from the recording itself.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.collectors.device import (
    DeviceCollector,
    DeviceSampler,
    readings_to_row,
    record_nvml,
    resolve_nvml_index,
)
from gpudash.collectors.nvml import (
    GPM_COLUMNS,
    METRICS,
    NvmlSource,
    RecordingSource,
    ReplaySource,
    Unsupported,
    nvml_call,
)
from gpudash.monitor import Monitor

FIXTURES = Path(__file__).parent.parent / "fixtures"
REAL = FIXTURES / "nvml_recording_h200.json"
RECORDING = REAL if REAL.exists() else FIXTURES / "nvml_recording_synthetic.json"


@pytest.fixture
def recording() -> dict[str, Any]:
    return json.loads(RECORDING.read_text())


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
    assert sampler.supported[gpu] == [m for m in METRICS if m in ok]
    for tick, row in zip(recording["ticks"], [r for r in rows if r["gpu"] == gpu], strict=True):
        raw = tick["gpus"][str(gpu)]
        assert row["time"] == tick["t"]
        if "power" in raw:
            assert row["power_w"] == pytest.approx(raw["power"] / 1000)
        if "pcie_rx" in raw:
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
                    assert row[col] == pytest.approx(raw["gpm"][str(mid)])
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
    assert again["probe"] == {g: {m: s for m, s in p.items() if m in METRICS} for g, p in recording["probe"].items()}
    replay = DeviceSampler(ReplaySource(json.loads(json.dumps(again))), gpus, pid=recording.get("pid"))
    replay.probe()
    assert [replay.sample() for _ in range(5)] == first


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
