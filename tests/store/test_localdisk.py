"""One place chooses the local folders and read limits (issue 45): staging of a run recorded into a store, the
opened runs' segment cache, and the cache's size (flag, environment, default)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpudash.store import localdisk
from gpudash.store.mirror import SegmentMirror
from gpudash.store.objstore import local_staging, open_store
from gpudash.store.sharedfs import LOCAL_DIR_ENV


def test_every_local_folder_is_under_the_staging_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "node-local"
    monkeypatch.setenv(LOCAL_DIR_ENV, str(base))
    staged = local_staging("s3://bucket/runs/exp1")
    assert staged.parent == base and staged.name.startswith("gpudash-exp1-") and staged.stat().st_mode & 0o777 == 0o700
    (tmp_path / "run").mkdir()
    m = SegmentMirror(open_store(tmp_path / "run"), lambda msg: None)
    try:
        assert m.folder.parent == base / ".gpudash-cache"  # hidden: never listed as a run of the same folder
    finally:
        m.close()
    assert not m.folder.exists()


def test_the_cache_limit_comes_from_the_flag_then_the_environment_then_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(localdisk.CACHE_MB_ENV, raising=False)
    assert localdisk.cache_limit() == localdisk.CACHE_MB << 20
    monkeypatch.setenv(localdisk.CACHE_MB_ENV, "100")
    assert localdisk.cache_limit() == 100 << 20
    monkeypatch.setenv(localdisk.CACHE_MB_ENV, "many")  # said by gpudash serve at start; the default holds here
    assert localdisk.cache_limit() == localdisk.CACHE_MB << 20
    localdisk.set_cache_limit(5 << 20)
    try:
        assert localdisk.cache_limit() == 5 << 20
    finally:
        localdisk.set_cache_limit(None)
    with pytest.raises(ValueError, match="positive"):
        localdisk.parse_cache_mb("inf")


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12)))
def test_a_cache_size_is_a_positive_number_of_bytes_or_one_line(text: str) -> None:
    try:
        got = localdisk.parse_cache_mb(text)
    except ValueError as exc:
        assert "\n" not in str(exc) and "--cache-mb" in str(exc)
    else:
        assert isinstance(got, int) and got >= 1 and float(text) > 0
