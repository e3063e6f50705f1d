"""Stored snapshot summaries (v1, JSON) read back with a bound: a crafted run database cannot inflate one
without limit."""

from __future__ import annotations

import json
import zlib

import pandas as pd
import pytest

from gpudash.store import snapshot_codec
from gpudash.store.snapshot import SUMMARY_FORMAT_V1 as SUMMARY_FORMAT
from gpudash.store.snapshot import decode_summary, encode_summary, snapshots_from_frame


def _bomb(inflated: int) -> bytes:
    """Valid zlib of a JSON summary padded with ``inflated`` spaces (a few KiB compressed)."""
    head = json.dumps({"format": SUMMARY_FORMAT, "segments": {}, "blocks": {}}).encode()
    z = zlib.compressobj(9)
    out = z.compress(head[:-1])
    chunk = b" " * (1 << 20)
    for _ in range(inflated // len(chunk)):
        out += z.compress(chunk)
    return out + z.compress(b"}") + z.flush()


def test_a_zlib_bomb_is_refused_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = _bomb(24 << 20)
    assert len(blob) < 100_000  # 24 MiB of JSON in a small row
    with pytest.raises(ValueError, match="inflates to over 8 MiB"):
        decode_summary(blob, max_bytes=8 << 20)
    monkeypatch.setattr(snapshot_codec, "MAX_V1_BYTES", 8 << 20)
    problems: list[str] = []
    row = {"time": 1.0, "step": 7, "reason": "crafted", "format": SUMMARY_FORMAT, "data": blob}
    assert snapshots_from_frame(pd.DataFrame([row]), problems) == []
    assert len(problems) == 1 and "\n" not in problems[0]
    assert "snapshot (step 7, crafted)" in problems[0] and "inflates to over 8 MiB" in problems[0]


def test_a_summary_under_the_cap_and_a_cut_one() -> None:
    blob = _bomb(2 << 20)
    assert decode_summary(blob, max_bytes=4 << 20)["format"] == SUMMARY_FORMAT
    good = encode_summary({"format": SUMMARY_FORMAT, "segments": {}, "blocks": {}})
    with pytest.raises(ValueError, match="cut short"):
        decode_summary(good[:-6])
