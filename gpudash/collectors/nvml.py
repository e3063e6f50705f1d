"""A thin NVML (``nvidia-ml-py``) layer: raw readings from NVML, a recorder, a replayer.

Layers, as in nvitop: a *source* answers raw readings (:class:`NvmlSource`
calls NVML through one helper, :func:`nvml_call`, that turns "not supported /
not found / no library" into :class:`Unsupported`; :class:`ReplaySource`
answers from a recording, :class:`RecordingSource` keeps what another source
answered); ``gpudash.collectors.device`` probes what each device supports,
samples only that in a background thread and turns readings into rows.

Raw metrics (name: NVML call -> raw value):

* ``utilization``: GetUtilizationRates -> [gpu %, memory-controller %]
* ``memory``: GetMemoryInfo -> [total, used, free] bytes
* ``pcie_tx`` / ``pcie_rx``: GetPcieThroughput -> KB/s over a 20 ms window. NVML measures that
  window inside the call, so each call blocks ~20 ms: on an H200 one sample of every metric took 47.6 ms
  (median), a 20 Hz sampler spent ~95 % of its time inside NVML. The sampler therefore reads this pair only
  where ``gpm`` is absent, and then at most once per ``gpudash.collectors.device.PCIE_EVERY_S``; where GPM
  answers, PCIe comes from its ids 20/21 (:data:`GPM_PCIE`) instead
* ``power``: GetPowerUsage -> mW; ``energy``: GetTotalEnergyConsumption -> mJ
* ``temperature``: GetTemperature(GPU) -> °C
* ``sm_clock`` / ``mem_clock``: GetClockInfo -> MHz
* ``clock_events``: GetCurrentClocksEventReasons -> bitmask (throttle reasons)
* ``processes``: GetComputeRunningProcesses -> [[pid, used bytes or null], ...]
* ``gpm`` (Hopper+): GpmMetricsGet over the previous and the current sample ->
  {metric id: value} (:data:`GPM_COLUMNS`; PCIe TX/RX there cover the whole interval between two samples
  and cost no waiting)

Recording format (:func:`gpudash.collectors.device.record_nvml` writes it; JSON)::

    {"format": "gpudash-nvml-recording", "version": 1, "synthetic": false,
     "pid": 1234, "driver_version": "...", "hz": 20.0, "sample_cost_us": 180.0,
     "devices": [{"index", "uuid", "pci_bus_id", "name", "memory_total_bytes"}],
     "probe": {"0": {"utilization": "ok", "gpm": "ok", "energy": "not supported: ..."}},
     "ticks": [{"t": 1.7e9, "gpus": {"0": {"utilization": [97, 41], ...}}}]}

A reading that failed at run time is stored as ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "GPM_COLUMNS",
    "GPM_PCIE",
    "METRICS",
    "PCIE_METRICS",
    "RECORDING_FORMAT",
    "DeviceSource",
    "NvmlSource",
    "RecordingSource",
    "ReplaySource",
    "Unsupported",
    "nvml_call",
]

RECORDING_FORMAT = "gpudash-nvml-recording"
METRICS = ("utilization", "memory", "pcie_tx", "pcie_rx", "power", "energy", "temperature", "sm_clock",
           "mem_clock", "clock_events", "processes", "gpm")
#: GPM metric id -> device column (NVML_GPM_METRIC_*; PCIe and NVLink in MiB/s)
GPM_COLUMNS = {2: "sm_active_pct", 3: "sm_occupancy_pct", 5: "tensor_active_pct", 10: "dram_bw_pct",
               20: "gpm_pcie_tx_mib_s", 21: "gpm_pcie_rx_mib_s", 60: "nvlink_rx_mib_s", 61: "nvlink_tx_mib_s"}
#: The legacy PCIe pair (nvmlDeviceGetPcieThroughput: blocks ~20 ms a call, see the module docstring)
PCIE_METRICS = ("pcie_tx", "pcie_rx")
#: legacy PCIe metric -> the GPM metric id of the same traffic (MiB/s), read instead where GPM answers
GPM_PCIE = {"pcie_tx": 20, "pcie_rx": 21}
_UNSUPPORTED_CODES = {3: "not supported", 6: "not found", 13: "function not found (driver too old)",
                      4: "no permission"}


class Unsupported(Exception):
    """This reading does not exist here (no library, no GPU, not on this product)."""


def nvml_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call one NVML function; "not supported/found/permitted" and a missing library become Unsupported."""
    try:
        return fn(*args)
    except Exception as exc:
        code = getattr(exc, "value", None)
        name = type(exc).__name__
        if code in _UNSUPPORTED_CODES:
            raise Unsupported(_UNSUPPORTED_CODES[code]) from None
        if name in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NotSupported",
                    "NVMLError_NotFound", "NVMLError_FunctionNotFound", "NVMLError_NoPermission"):
            raise Unsupported(str(exc) or name) from None
        raise


class DeviceSource(Protocol):
    def devices(self) -> list[dict[str, Any]]: ...

    def tick(self) -> float:
        """Start a new sample; returns its wall time."""
        ...

    def read(self, gpu: int, metric: str) -> Any: ...

    def close(self) -> None: ...


# ---- NVML ----------------------------------------------------------------------------------
class NvmlSource:
    """Real NVML readings. Raises :class:`Unsupported` when NVML or a driver is absent."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise Unsupported("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
        self.nv = pynvml
        nvml_call(pynvml.nvmlInit)
        self._handles = [nvml_call(pynvml.nvmlDeviceGetHandleByIndex, i)
                         for i in range(nvml_call(pynvml.nvmlDeviceGetCount))]
        self._gpm_prev: dict[int, Any] = {}
        nv = pynvml
        clock_events: Callable[[Any], Any] = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        self._reads: dict[str, Callable[[Any], Any]] = {
            "utilization": lambda h: (lambda u: [u.gpu, u.memory])(nv.nvmlDeviceGetUtilizationRates(h)),
            "memory": lambda h: (lambda m: [m.total, m.used, m.free])(nv.nvmlDeviceGetMemoryInfo(h)),
            "pcie_tx": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_rx": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
            "power": nv.nvmlDeviceGetPowerUsage,
            "energy": nv.nvmlDeviceGetTotalEnergyConsumption,
            "temperature": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "sm_clock": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "clock_events": clock_events,
            "processes": lambda h: [[p.pid, p.usedGpuMemory] for p in nv.nvmlDeviceGetComputeRunningProcesses(h)],
        }

    def devices(self) -> list[dict[str, Any]]:
        nv = self.nv
        out = []
        for i, h in enumerate(self._handles):
            d: dict[str, Any] = {"index": i}
            for key, fn in (("uuid", nv.nvmlDeviceGetUUID), ("name", nv.nvmlDeviceGetName),
                            ("pci_bus_id", lambda h: nv.nvmlDeviceGetPciInfo(h).busId),
                            ("memory_total_bytes", lambda h: nv.nvmlDeviceGetMemoryInfo(h).total)):
                try:
                    v = nvml_call(fn, h)
                    d[key] = v.decode() if isinstance(v, bytes) else v
                except Exception:  # noqa: BLE001 - identity fields are best effort
                    pass
            out.append(d)
        return out

    def driver_version(self) -> str:
        try:
            v = self.nv.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:  # noqa: BLE001
            return ""

    def tick(self) -> float:
        return time.time()

    def read(self, gpu: int, metric: str) -> Any:
        h = self._handles[gpu]
        if metric == "gpm":
            return self._gpm(gpu, h)
        fn = self._reads.get(metric)
        if fn is None:
            raise Unsupported(f"no NVML call for {metric}")
        return nvml_call(fn, h)

    def _gpm(self, gpu: int, h: Any) -> Any:
        nv = self.nv
        prev = self._gpm_prev.get(gpu)
        if prev is None:
            if not nvml_call(nv.nvmlGpmQueryDeviceSupport, h).isSupportedDevice:
                raise Unsupported("GPM needs a Hopper or newer GPU")
            self._gpm_prev[gpu] = nvml_call(nv.nvmlGpmSampleGet, h, nvml_call(nv.nvmlGpmSampleAlloc))
            return None  # the first sample only primes the pair
        cur = nvml_call(nv.nvmlGpmSampleGet, h, nvml_call(nv.nvmlGpmSampleAlloc))
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_COLUMNS)
        req.sample1, req.sample2 = prev, cur
        for i, mid in enumerate(GPM_COLUMNS):
            req.metrics[i].metricId = mid
        nvml_call(nv.nvmlGpmMetricsGet, req)
        nvml_call(nv.nvmlGpmSampleFree, prev)
        self._gpm_prev[gpu] = cur
        return {str(req.metrics[i].metricId): req.metrics[i].value
                for i in range(len(GPM_COLUMNS)) if req.metrics[i].nvmlReturn == 0}

    def close(self) -> None:
        for s in self._gpm_prev.values():
            try:
                self.nv.nvmlGpmSampleFree(s)
            except Exception:  # noqa: BLE001
                pass
        self._gpm_prev.clear()
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# ---- recording and replay -------------------------------------------------------------------
class RecordingSource:
    """Wraps a source and keeps every raw reading, in the recording format."""

    def __init__(self, inner: DeviceSource, max_ticks: int = 100_000) -> None:
        self.inner = inner
        self.max_ticks = max_ticks
        self.probe: dict[str, dict[str, str]] = {}
        self.ticks: list[dict[str, Any]] = []
        self._cur: dict[str, Any] | None = None

    def devices(self) -> list[dict[str, Any]]:
        return self.inner.devices()

    def tick(self) -> float:
        t = self.inner.tick()
        if len(self.ticks) < self.max_ticks:
            self._cur = {"t": t, "gpus": {}}
            self.ticks.append(self._cur)
        else:
            self._cur = None
        return t

    def read(self, gpu: int, metric: str) -> Any:
        try:
            value = self.inner.read(gpu, metric)
        except Unsupported as exc:
            if not self.ticks:
                self.probe.setdefault(str(gpu), {})[metric] = f"not supported: {exc}"
            raise
        except Exception as exc:
            if self._cur is not None:
                self._cur["gpus"].setdefault(str(gpu), {})[metric] = {"error": f"{type(exc).__name__}: {exc}"}
            raise
        if not self.ticks:
            self.probe.setdefault(str(gpu), {})[metric] = "ok"
        elif self._cur is not None:
            self._cur["gpus"].setdefault(str(gpu), {})[metric] = value
        return value

    def recording(self, **extra: Any) -> dict[str, Any]:
        return {"format": RECORDING_FORMAT, "version": 1, "synthetic": False, "pid": os.getpid(), **extra,
                "devices": self.devices(), "probe": self.probe, "ticks": self.ticks}

    def close(self) -> None:
        self.inner.close()


class ReplaySource:
    """Answers from a recording: probe results first, then one tick per :meth:`tick`."""

    def __init__(self, recording: dict[str, Any]) -> None:
        if recording.get("format") != RECORDING_FORMAT:
            raise ValueError(f"not an NVML recording (format {recording.get('format')!r})")
        self.rec = recording
        self._i = -1

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ReplaySource:
        return cls(json.loads(Path(path).read_text()))

    @property
    def exhausted(self) -> bool:
        return self._i >= len(self.rec["ticks"]) - 1

    def devices(self) -> list[dict[str, Any]]:
        return list(self.rec["devices"])

    def tick(self) -> float:
        if self.exhausted:
            raise EOFError("end of recording")
        self._i += 1
        return float(self.rec["ticks"][self._i]["t"])

    def read(self, gpu: int, metric: str) -> Any:
        status = self.rec.get("probe", {}).get(str(gpu), {}).get(metric, "not recorded")
        if status != "ok":
            raise Unsupported(status)
        if self._i < 0:
            return None  # probing: supported, value not needed
        value = self.rec["ticks"][self._i]["gpus"].get(str(gpu), {}).get(metric)
        if isinstance(value, dict) and set(value) == {"error"}:
            raise RuntimeError(value["error"])
        return value

    def close(self) -> None:
        pass
