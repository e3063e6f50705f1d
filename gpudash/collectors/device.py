"""This process's GPU as rows of the ``device`` table, sampled from NVML in a daemon thread.

:class:`DeviceSampler` probes once what each GPU supports (through a source
from ``gpudash.collectors.nvml``: live NVML, or a recording being replayed)
and then reads only that; :func:`readings_to_row` turns one tick's raw
readings into unit-named columns: ``gpu_util_pct``, ``mem_util_pct``,
``memory_used_bytes``, ``pcie_tx_mib_s``/``pcie_rx_mib_s`` (see PCIe below),
``power_w``, ``energy_j``, ``temp_c``, ``sm_clock_mhz``, ``mem_clock_mhz``,
``throttle_mask`` and ``throttle_power``/``_thermal``/``_hw_slowdown``,
``gpu_idle``, ``processes``, ``process_memory_bytes`` (this process),
``other_processes_memory_bytes`` and, on Hopper+ (GPM), ``sm_active_pct``,
``sm_occupancy_pct``, ``tensor_active_pct``, ``dram_bw_pct``,
``gpm_pcie_tx_mib_s``/``gpm_pcie_rx_mib_s``, ``nvlink_tx_mib_s``/``nvlink_rx_mib_s``.

PCIe: ``nvmlDeviceGetPcieThroughput`` (raw ``pcie_tx``/``pcie_rx``) blocks ~20 ms a call while NVML
measures its 20 ms window (an H200 took 47.6 ms a sample, most of a 20 Hz sampler's time). So where the
probe finds GPM, the sampler never reads that pair (``unsupported`` says why: :data:`PCIE_VIA_GPM`) and
``pcie_tx_mib_s``/``pcie_rx_mib_s`` are GPM's ids 20/21, the traffic over the whole interval between two
samples (also kept as ``gpm_pcie_*``). Without GPM the pair is read at most once per :data:`PCIE_EVERY_S`
of the source's clock (``source.tick()``: wall time live, the recorded times in a replay); the rows in
between have no PCIe columns. Should GPM be dropped while sampling, the legacy pair comes back, once per
:data:`PCIE_EVERY_S`.

``gpu`` is the NVML index (what nvidia-smi shows), found from the training
thread's CUDA device by UUID, else PCI bus id, else CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudash.collectors.base import try_import_torch
from gpudash.collectors.env import placement
from gpudash.collectors.nvml import (
    GPM_COLUMNS,
    GPM_PCIE,
    METRICS,
    PCIE_METRICS,
    DeviceSource,
    NvmlSource,
    RecordingSource,
    Unsupported,
)
from gpudash.units import KiB, MiB

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["PCIE_EVERY_S", "PCIE_VIA_GPM", "DeviceCollector", "DeviceSampler", "readings_to_row", "record_nvml",
           "resolve_nvml_index", "torch_device_identity"]

# nvmlClocksEventReason* bits
_POWER, _HW_SLOWDOWN, _SW_THERMAL, _HW_THERMAL, _POWER_BRAKE, _IDLE = 0x4, 0x8, 0x20, 0x40, 0x80, 0x1
#: Seconds (of ``source.tick()`` time) between two reads of the legacy PCIe pair where GPM is absent
PCIE_EVERY_S = 1.0
#: Why the legacy PCIe pair is not read on a GPU with GPM (``DeviceSampler.unsupported``, meta ``device_unsupported``)
PCIE_VIA_GPM = "read from GPM: nvmlDeviceGetPcieThroughput blocks ~20 ms a call"


def readings_to_row(r: dict[str, Any], pid: int | None = None) -> dict[str, Any]:
    """Unit-named device columns from one tick's raw readings of one GPU.

    ``pcie_tx_mib_s``/``pcie_rx_mib_s`` come from the legacy readings where present, else from GPM's
    PCIe ids (:data:`~gpudash.collectors.nvml.GPM_PCIE`; a NaN there gives no value).
    """
    row: dict[str, Any] = {}
    if (u := r.get("utilization")) is not None:
        row["gpu_util_pct"], row["mem_util_pct"] = float(u[0]), float(u[1])
    if (m := r.get("memory")) is not None:
        row["memory_total_bytes"], row["memory_used_bytes"], row["memory_free_bytes"] = (int(x) for x in m)
    for key, col in (("pcie_tx", "pcie_tx_mib_s"), ("pcie_rx", "pcie_rx_mib_s")):
        if (v := r.get(key)) is not None:
            row[col] = float(v) * KiB / MiB  # NVML KB/s -> MiB/s
    if (v := r.get("power")) is not None:
        row["power_w"] = float(v) / 1000.0
    if (v := r.get("energy")) is not None:
        row["energy_j"] = float(v) / 1000.0
    if (v := r.get("temperature")) is not None:
        row["temp_c"] = float(v)
    if (v := r.get("sm_clock")) is not None:
        row["sm_clock_mhz"] = float(v)
    if (v := r.get("mem_clock")) is not None:
        row["mem_clock_mhz"] = float(v)
    if (v := r.get("clock_events")) is not None:
        mask = int(v)
        row["throttle_mask"] = mask
        row["throttle_power"] = int(bool(mask & (_POWER | _POWER_BRAKE)))
        row["throttle_thermal"] = int(bool(mask & (_SW_THERMAL | _HW_THERMAL)))
        row["throttle_hw_slowdown"] = int(bool(mask & _HW_SLOWDOWN))
        row["gpu_idle"] = int(bool(mask & _IDLE))
    if (procs := r.get("processes")) is not None:
        row["processes"] = len(procs)
        mine = [int(b) for p, b in procs if p == pid and b is not None]
        others = [int(b) for p, b in procs if p != pid and b is not None]
        if pid is not None:
            row["process_memory_bytes"] = sum(mine)
        row["other_processes_memory_bytes"] = sum(others)
    if isinstance(gpm := r.get("gpm"), dict):
        for mid, col in GPM_COLUMNS.items():
            v = gpm.get(str(mid), gpm.get(mid))  # type: ignore[call-overload]
            if v is not None:
                row[col] = float(v)
        for key, mid in GPM_PCIE.items():
            col = f"{key}_mib_s"
            v = gpm.get(str(mid), gpm.get(mid))  # type: ignore[call-overload]
            if col not in row and v is not None and math.isfinite(float(v)):
                row[col] = float(v)
    return row


class DeviceSampler:
    """Probes each GPU once, then reads only what it supports; ``sample()`` -> device rows.

    The legacy PCIe pair is skipped where GPM answers and read at most once per ``pcie_every_s`` (of
    ``source.tick()`` time) elsewhere: see the module docstring.
    """

    def __init__(self, source: DeviceSource, gpus: list[int], *, pid: int | None = None,
                 max_failures: int = 20, pcie_every_s: float = PCIE_EVERY_S) -> None:
        self.source = source
        self.gpus = list(gpus)
        self.pid = os.getpid() if pid is None else pid
        self.max_failures = max_failures
        self.pcie_every_s = pcie_every_s
        self._pcie_last: dict[int, float] = {}
        self.supported: dict[int, list[str]] = {}
        self.unsupported: dict[int, dict[str, str]] = {}
        self.failures: dict[tuple[int, str], int] = {}
        self.dropped: list[str] = []

    def probe(self) -> dict[int, list[str]]:
        for gpu in self.gpus:
            ok: set[str] = set()
            bad: dict[str, str] = {}
            # GPM first: where it answers, the blocking legacy PCIe pair is not even probed
            for metric in ("gpm", *(m for m in METRICS if m != "gpm")):
                if metric in PCIE_METRICS and "gpm" in ok:
                    bad[metric] = PCIE_VIA_GPM
                    continue
                try:
                    self.source.read(gpu, metric)
                    ok.add(metric)
                except Unsupported as exc:
                    bad[metric] = str(exc)
                except Exception as exc:  # noqa: BLE001 - a reading that fails at probe is not sampled
                    bad[metric] = f"{type(exc).__name__}: {exc}"
            self.supported[gpu] = [m for m in METRICS if m in ok]
            self.unsupported[gpu] = {m: bad[m] for m in METRICS if m in bad}
        self._pcie_last.clear()
        return self.supported

    def _pcie_due(self, gpu: int, t: float) -> bool:
        last = self._pcie_last.get(gpu)
        # a clock set back (wall time live) must not stop the reads until it catches up
        return last is None or t < last or t - last >= self.pcie_every_s

    def _gpm_dropped(self, gpu: int) -> None:
        """GPM stopped answering: the legacy PCIe pair comes back (an Unsupported read then drops it)."""
        unsupported = self.unsupported.setdefault(gpu, {})
        back = [m for m in PCIE_METRICS if unsupported.get(m) == PCIE_VIA_GPM]
        for m in back:
            del unsupported[m]
        if back:
            keep = set(self.supported[gpu]) | set(back)
            self.supported[gpu][:] = [m for m in METRICS if m in keep]
            self._pcie_last.pop(gpu, None)

    def sample(self) -> list[dict[str, Any]]:
        t = self.source.tick()
        rows = []
        for gpu in self.gpus:
            readings: dict[str, Any] = {}
            pcie_due = self._pcie_due(gpu, t)
            if pcie_due:
                self._pcie_last[gpu] = t
            for metric in list(self.supported.get(gpu, ())):
                if not pcie_due and metric in PCIE_METRICS:
                    continue
                try:
                    readings[metric] = self.source.read(gpu, metric)
                    self.failures.pop((gpu, metric), None)
                except Exception as exc:  # noqa: BLE001 - one failed reading skips that value
                    n = self.failures[(gpu, metric)] = self.failures.get((gpu, metric), 0) + 1
                    if isinstance(exc, Unsupported) or n >= self.max_failures:
                        self.supported[gpu].remove(metric)
                        self.dropped.append(f"gpu {gpu} {metric}: {exc}")
                        if metric == "gpm":
                            self._gpm_dropped(gpu)
            row = readings_to_row(readings, self.pid)
            row["time"] = t
            row["gpu"] = gpu
            rows.append(row)
        return rows


# ---- which NVML device is this process's CUDA device ----------------------------------------
def _pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """``"00000000:3B:00.0"`` -> (domain, bus, device)."""
    try:
        dom, bus, rest = str(bus_id).strip().split(":")
        return int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def resolve_nvml_index(devices: list[dict[str, Any]], cuda_index: int, *, uuid: str | None = None,
                       pci: tuple[int, int, int] | None = None, visible: str | None = None) -> int | None:
    """NVML index of CUDA device ``cuda_index``: by UUID, else PCI bus id, else CUDA_VISIBLE_DEVICES.

    ``visible`` entries may be indices (NVML order, which is PCI order; CUDA's
    default order can differ, so UUID/PCI from torch win), ``GPU-<uuid>``
    prefixes or ``MIG-...`` (mapped only via UUID/PCI).
    """
    if uuid:
        u = uuid.lower().removeprefix("gpu-")
        for d in devices:
            if str(d.get("uuid", "")).lower().removeprefix("gpu-") == u:
                return int(d["index"])
    if pci is not None:
        for d in devices:
            if _pci_key(d.get("pci_bus_id", "")) == pci:
                return int(d["index"])
    if visible is not None and visible.strip():
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if cuda_index >= len(entries):
            return None
        e = entries[cuda_index]
        if e.lstrip("-").isdigit():
            i = int(e)
            return i if 0 <= i < len(devices) else None
        if e.lower().startswith("gpu-"):
            matches = [d for d in devices if str(d.get("uuid", "")).lower().startswith(e.lower())]
            return int(matches[0]["index"]) if len(matches) == 1 else None
        return None
    return cuda_index if 0 <= cuda_index < len(devices) else None


def torch_device_identity(torch: Any, index: int) -> tuple[str | None, tuple[int, int, int] | None]:
    """UUID and PCI (domain, bus, device) torch reports for a CUDA device (where it does)."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    pci = None
    if getattr(props, "pci_bus_id", None) is not None:
        pci = (int(getattr(props, "pci_domain_id", 0)), int(props.pci_bus_id), int(getattr(props, "pci_device_id", 0)))
    return (str(uuid) if uuid is not None else None), pci


# ---- the collector --------------------------------------------------------------------------
class DeviceCollector:
    """Samples this process's GPU at ``hz`` in a daemon thread into the ``device`` table."""

    name = "device"

    def __init__(self, hz: float = 10.0, *, source_factory: Callable[[], DeviceSource] | None = None,
                 gpus: list[int] | None = None) -> None:
        self.hz = hz
        self.source_factory = source_factory or NvmlSource
        self.gpus = gpus
        self.sampler: DeviceSampler | None = None
        self.samples = 0
        self.busy_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._monitor: Recording | None = None
        self._source: DeviceSource | None = None
        self._devices: list[dict[str, Any]] = []
        self._cuda_pending = False
        self._pending_gpus: list[int] | None = None

    def start(self, monitor: Recording) -> None:
        self._monitor = monitor
        try:
            source = self.source_factory()
            devices = source.devices()
        except Unsupported as exc:
            monitor.unavailable(self.name, f"NVML: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a broken driver is a state
            monitor.unavailable(self.name, f"NVML failed: {type(exc).__name__}: {exc}")
            return
        if not devices:
            monitor.unavailable(self.name, "NVML sees no GPU")
            source.close()
            return
        self._source, self._devices = source, devices
        gpus = self.gpus if self.gpus is not None else self._guess_gpus()
        self._set_gpus(gpus)
        torch = try_import_torch()
        if self.gpus is None and torch is not None:
            self._cuda_pending = True
            monitor.add_step_hooks(start=self._on_step_start)
        self._thread = threading.Thread(target=self._run, name="gpudash-device", daemon=True)
        self._thread.start()

    def _guess_gpus(self) -> list[int]:
        local = placement().local_rank
        idx = resolve_nvml_index(self._devices, 0 if local is None else local,
                                 visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
        return [idx if idx is not None else 0]

    def _set_gpus(self, gpus: list[int]) -> None:
        assert self._source is not None and self._monitor is not None
        sampler = DeviceSampler(self._source, gpus)
        sampler.probe()
        self.sampler = sampler
        self._monitor.set_meta(device_gpus=gpus, device_metrics={str(g): m for g, m in sampler.supported.items()},
                               device_unsupported={str(g): m for g, m in sampler.unsupported.items()})

    def _on_step_start(self, step: int) -> None:
        # CUDA's current device is per thread: learn it here, once CUDA is up (no init forced)
        if not self._cuda_pending:
            return
        torch = try_import_torch()
        if not torch.cuda.is_initialized():
            return
        self._cuda_pending = False
        idx = torch.cuda.current_device()
        uuid, pci = torch_device_identity(torch, idx)
        nvml = resolve_nvml_index(self._devices, idx, uuid=uuid, pci=pci,
                                  visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
        if nvml is not None and self.sampler is not None and [nvml] != self.sampler.gpus:
            self._pending_gpus = [nvml]

    def _run(self) -> None:
        monitor = self._monitor
        assert monitor is not None
        period = 1.0 / self.hz
        put = monitor.put
        reported = 0
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                pending = self._pending_gpus
                if pending is not None:
                    self._pending_gpus = None
                    self._set_gpus(pending)
                sampler = self.sampler
                assert sampler is not None
                for row in sampler.sample():
                    put("device", row)
                self.samples += 1
                for msg in sampler.dropped[reported:]:
                    monitor.event("device_metric_dropped", msg)
                reported = len(sampler.dropped)
            except EOFError:
                return  # a replayed recording ran out
            except Exception as exc:  # noqa: BLE001 - never kill the sampler silently
                monitor.unavailable(self.name, f"sampling failed: {type(exc).__name__}: {exc}")
                return
            dt = time.perf_counter() - t0
            self.busy_s += dt
            self._stop.wait(max(0.0, period - dt))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self._thread = None
        if self._source is not None:
            self._source.close()
            self._source = None


def record_nvml(path: str | os.PathLike[str], seconds: float = 10.0, hz: float = 20.0,
                gpus: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    """Record raw NVML readings for ``seconds`` at ``hz`` into ``path`` (the replay fixture).

    Run it on a GPU while something trains (issue 7's prepared script). Returns
    the recording, with the measured ``sample_cost_us`` (median per tick).
    """
    rec = RecordingSource(NvmlSource())
    try:
        devices = rec.devices()
        sampler = DeviceSampler(rec, gpus if gpus is not None else [d["index"] for d in devices])
        sampler.probe()
        costs = []
        period = 1.0 / hz
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            sampler.sample()
            dt = time.perf_counter() - t0
            costs.append(dt)
            time.sleep(max(0.0, period - dt))
        costs.sort()
        inner = rec.inner
        out = rec.recording(hz=hz, driver_version=inner.driver_version() if isinstance(inner, NvmlSource) else "",
                            sample_cost_us=1e6 * costs[len(costs) // 2] if costs else None, **extra)
    finally:
        rec.close()
    Path(path).write_text(json.dumps(out))
    return out
