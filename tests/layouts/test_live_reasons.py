"""A live run on a machine without a GPU: the device panel says why (what the collector noted) at once,
not "waiting for the first records..." until the run ends."""

from __future__ import annotations

from pathlib import Path

from gpudash.server.runcache import shared_cache


def _ids(c: object, out: dict[str, object]) -> dict[str, object]:
    if isinstance(c, list | tuple):
        for x in c:
            _ids(x, out)
    elif c is not None and not isinstance(c, str | int | float):
        if isinstance(getattr(c, "id", None), str):
            out[c.id] = c  # type: ignore[attr-defined]
        _ids(getattr(c, "children", None), out)
    return out


def test_live_device_panel_gives_the_noted_reason(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor
    from gpudash.server.layouts.pages import build_run_page

    with Monitor(tmp_path / "cpu", host_hz=0.0, handle_signals=False) as mon:
        mon.unavailable("device", "NVML: NVML Shared Library Not Found")  # what the collector notes on this machine
        for _ in range(3):
            with mon.step():
                pass
        assert mon.flush()
        shared_cache().clear()
        reader, lock = shared_cache().reader(tmp_path / "cpu")
        with lock:
            page = build_run_page("cpu", reader)
        ids = _ids(page, {})
        assert reader.status() == "live"
        assert "NVML Shared Library Not Found" in str(ids["device-graph-reason"].children)  # type: ignore[attr-defined]
        assert "device-graph" in ids  # still there (hidden) for the live tick
        assert "host-graph-reason" not in ids  # host_hz=0 noted nothing: the host panel waits as before
