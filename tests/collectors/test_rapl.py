"""CPU energy from a fake powercap tree: packages summed, parts left out, wraparound, unreadable said."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudash.collectors.rapl import ENV_ROOT, open_rapl


def _domain(root: Path, name: str, uj: int, top: int = 1000_000_000) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "max_energy_range_uj").write_text(f"{top}\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    return d


def test_packages_summed_across_a_wraparound(tmp_path: Path) -> None:
    p0 = _domain(tmp_path, "intel-rapl:0", 999_000_000)
    p1 = _domain(tmp_path, "intel-rapl:1", 5_000_000)
    part = _domain(tmp_path, "intel-rapl:0:0", 1)  # the package's core part: already in intel-rapl:0
    rapl, why = open_rapl(str(tmp_path))
    assert rapl is not None and why is None and rapl.packages == 2
    assert rapl.read() == 0.0
    (p0 / "energy_uj").write_text("2000000\n")  # wrapped at 1000 J: 1 J + 2 J
    (p1 / "energy_uj").write_text("9000000\n")  # + 4 J
    (part / "energy_uj").write_text("500000000\n")
    assert rapl.read() == pytest.approx(7.0)
    (p1 / "energy_uj").unlink()  # a package that stops being readable keeps what it counted
    assert rapl.read() == pytest.approx(7.0)


def test_unreadable_or_missing_counters_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rapl, why = open_rapl(str(tmp_path / "none"))
    assert rapl is None and why and "not readable" in why
    d = _domain(tmp_path, "intel-rapl:0", 1)
    (d / "energy_uj").unlink()  # as where only root may read it
    monkeypatch.setenv(ENV_ROOT, str(tmp_path))
    rapl, why = open_rapl()
    assert rapl is None and why and "energy_uj" in why
