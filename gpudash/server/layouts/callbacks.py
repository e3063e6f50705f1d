"""All the dashboard's Dash callbacks, registered by :func:`register_callbacks`: one ``register_*`` per page
or view, each beside it, over callback bodies that are pure functions of the browser's payload.

========================  =====================================================================
routing                   the address to the page it shows
run_callbacks             the run page's view: address, smoothing, zoom re-queries, ranks, summary
live_callbacks            the run page's live tick (its reading and figures: ``live.tick_view``)
replay_callbacks          the replay bar: play, cursor moves, the views at the cursor, snapshot button
xaxis_callbacks           the step graphs' x axis control and the cursor line in time
progressbar               the header's progress bar
lazy                      charts and tables below the fold, drawn when scrolled to
snapshot_callbacks        the snapshot views: allocation timeline, an imported snapshot's page, the diff
runs_callbacks            the runs list and the compare page's baseline and link
========================  =====================================================================

Run ids are resolved inside RUNS_DIR only (:class:`ReaderCache`); a callback input no page sends raises
:class:`gpudash.server.layouts.inputs.BadInput`, which the app answers with a one-line 400.
"""

from __future__ import annotations

from pathlib import Path

import dash
from gpudash.server.layouts.lazy import register_lazy_callbacks
from gpudash.server.layouts.live_callbacks import register_live_callbacks
from gpudash.server.layouts.pages import facts_for
from gpudash.server.layouts.progressbar import register_progress_callbacks
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.replay_callbacks import SnapshotRequests, event_inputs, register_replay_callbacks
from gpudash.server.layouts.routing import page_for, register_route_callbacks
from gpudash.server.layouts.run_callbacks import register_run_callbacks
from gpudash.server.layouts.runs_callbacks import register_runs_callbacks
from gpudash.server.layouts.snapshot_callbacks import register_snapshot_callbacks
from gpudash.server.layouts.viewstate import view_params, view_search, zoom_range
from gpudash.server.layouts.xaxis_callbacks import register_xaxis_callbacks

__all__ = ["ReaderCache", "SnapshotRequests", "event_inputs", "page_for", "register_callbacks", "view_params",
           "view_search", "zoom_range"]


def register_callbacks(app: dash.Dash, runs_dir: Path, readers: ReaderCache) -> None:
    """Every callback of the dashboard on ``app``, over the runs in ``runs_dir`` opened through ``readers``."""
    register_route_callbacks(app, runs_dir, readers)
    register_run_callbacks(app, runs_dir, readers)
    register_runs_callbacks(app, runs_dir)
    register_xaxis_callbacks(app, readers)
    register_progress_callbacks(app, lambda run_id: facts_for(readers.get_or_skip(run_id)[0].path))
    register_live_callbacks(app, readers)
    register_replay_callbacks(app, readers)
    register_snapshot_callbacks(app, readers)
    register_lazy_callbacks(app, readers)
