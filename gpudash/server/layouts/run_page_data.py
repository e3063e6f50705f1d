"""What the run page shows, typed: :class:`RunPageData`, built by
:func:`gpudash.server.layouts.pages.build_run_page` and rendered by :func:`gpudash.server.layouts.run_page.run_page`.

A field per part of the page (a new header line is a new field), so a part left out or misspelt is a type
error, not a silently empty box."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudash.server.layouts.data import RunView
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.series import Series
from gpudash.server.layouts.xaxis import XAxis

if TYPE_CHECKING:  # the facts module loads pandas: `gpudash serve` answers its first page before pandas has loaded
    from gpudash.analysis.facts import Facts

__all__ = ["RunPageData"]


@dataclass(kw_only=True, slots=True)
class RunPageData:
    """One run page: the run, its live charts, and the parts drawn once (memory at the cursor, snapshots,
    activations, tables' rows, the ranks section)."""

    run_id: str
    """The run's id in the runs folder (the page's links)."""
    view: RunView
    """The run's frames (downsampled), meta, status, ranks and problems."""
    rank: int = 0
    """The rank the per-rank charts show."""
    figs: dict[str, Fig]
    """The live charts by graph id: drawn (the first screen) or a placeholder drawn when scrolled to."""
    specs: dict[str, list[Series]]
    """Each live chart's series (a chart without any says why it is empty)."""
    state: dict[str, Any]
    """The ``live-state`` the live tick starts from."""
    facts: Facts | None = None
    """The run's facts: the header's step and progress, the throughput lines, the lights (None: unreadable)."""
    cursor: int | None = None
    """The replay cursor's step from the address (None: the last step)."""
    smooth: float = 0.0
    """The EMA smoothing chosen (0: off)."""
    x: XAxis = field(default_factory=XAxis)
    """The step charts' x axis (step, relative or wall time)."""
    memory_at: Fig
    """Memory by category at the cursor."""
    segment_map: Fig | str
    """The allocator segment map of the snapshot at the cursor, or why there is none."""
    snapshots: list[Any] = field(default_factory=list)
    """The run's decoded snapshots (segment maps), oldest first."""
    snapshot_options: list[dict[str, Any]] = field(default_factory=list)
    """The snapshot picker's choices."""
    largest: Any = None
    """The snapshot whose largest live allocations are listed (None: no snapshot)."""
    alloc_timeline: Any = None
    """The allocation timeline's box (its chart, or why there is none)."""
    alloc_timeline_key: Any = None
    """Which snapshot the timeline shows (a zoom re-reads that one)."""
    activations: Fig
    """Activations per module at the cursor."""
    event_rows: list[dict[str, Any]] = field(default_factory=list)
    """The events table's rows (the table is built when scrolled to)."""
    hotspot_rows: list[dict[str, Any]] = field(default_factory=list)
    """The Python hot spots table's rows."""
    ranks: list[Any] = field(default_factory=list)
    """The Ranks section's children (empty with one rank)."""
