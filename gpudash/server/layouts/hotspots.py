"""Python hot spots from py-spy's folded stacks: which frames the training process spends its time in."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd
from dash import dash_table

__all__ = ["hotspot_rows", "hotspots_table"]


def hotspot_rows(stacks: pd.DataFrame, top: int = 25) -> list[dict[str, Any]]:
    """Top frames by samples: ``self`` (frame on top of the stack) and ``total`` (anywhere in it), in %."""
    if not len(stacks) or "stack" not in stacks:
        return []
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    counts = pd.to_numeric(stacks["count"], errors="coerce").fillna(1).astype(int) if "count" in stacks \
        else pd.Series(1, index=stacks.index)
    for stack, n in zip(stacks["stack"].astype(str), counts, strict=False):
        frames = [f for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return []
    ranked = sorted(incl, key=lambda f: (own[f], incl[f]), reverse=True)[:top]
    return [{"frame": f, "self_pct": round(100 * own[f] / total, 1), "total_pct": round(100 * incl[f] / total, 1),
             "samples": own[f]} for f in ranked]


def hotspots_table(rows: list[dict[str, Any]]) -> Any:
    return dash_table.DataTable(  # type: ignore[attr-defined]
        id="hotspots-table", data=rows, page_size=15, sort_action="native",
        columns=[{"name": "frame", "id": "frame"}, {"name": "self %", "id": "self_pct"},
                 {"name": "total %", "id": "total_pct"}, {"name": "samples", "id": "samples"}],
        style_cell={"textAlign": "left", "fontSize": 12, "fontFamily": "monospace", "maxWidth": 700,
                    "whiteSpace": "normal", "height": "auto"},
    )
