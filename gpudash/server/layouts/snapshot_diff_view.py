"""The snapshot diff and the largest live allocations, rendered (the facts are
:mod:`gpudash.analysis.snapshot_diff`): two snapshots' totals side by side, a bar per stack that grew or
shrank, and a table of those stacks with their frames."""

from __future__ import annotations

from typing import Any

from dash import dcc, html
from gpudash.analysis.snapshot_diff import LiveAllocation, SnapshotDiff, largest_live, snapshot_diff
from gpudash.server.layouts.common import base_figure, byte_unit, note, plot_text, unit_axis
from gpudash.server.layouts.fig import Fig
from gpudash.units import human_bytes

__all__ = ["diff_children", "diff_figure", "diff_options", "largest_children"]


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "±") + human_bytes(abs(n))


def _frames(stack: str) -> list[Any]:
    lines = [plot_text(f, 200) for f in stack.split("\n") if f]
    out: list[Any] = []
    for i, line in enumerate(lines):
        if i:
            out.append(html.Br())
        out.append(html.Span(line, className="frame" if i == 0 else "frame muted"))
    return out


def largest_children(mm: Any, n: int = 15) -> list[Any]:
    """The ``n`` largest live allocations of ``mm`` as a table (size, address, the frames that allocated it)."""
    rows: list[LiveAllocation] = largest_live(mm, n) if mm is not None else []
    if not rows:
        return [note("largest live allocations: none in this snapshot")]
    head = html.Tr([html.Th("size"), html.Th("requested"), html.Th("address"), html.Th("allocated by")])
    body = [html.Tr([html.Td(human_bytes(r.size)), html.Td(human_bytes(r.requested_size)), html.Td(f"{r.address:#x}"),
                     html.Td(_frames(r.stack))]) for r in rows]
    return [html.H4(f"Largest live allocations (of {len(mm.blocks[mm.blocks['state'] == 'active_allocated']):,})"),
            html.Div(html.Table([html.Thead(head), html.Tbody(body)], id="largest-allocations", className="table"),
                     style={"maxHeight": "380px", "overflowY": "auto"})]


def diff_options(maps: list[Any]) -> list[dict[str, Any]]:
    """The "compare with" choices: no diff, or any snapshot of the run."""
    opts: list[dict[str, Any]] = [{"label": "compare with: none", "value": "none"}]
    for i, mm in enumerate(maps):
        step = getattr(mm, "step", None)
        label = (f"step {step} " if step is not None else "") + (getattr(mm, "reason", "") or "")
        opts.append({"label": f"compare with: {label.strip() or f'snapshot {i + 1}'}", "value": str(i)})
    return opts


def diff_figure(diff: SnapshotDiff, n: int = 12) -> Fig:
    """Horizontal bars: the live bytes each stack gained (or lost) from A to B, the most grown on top."""
    rows = diff.rows[:n]
    unit, scale = byte_unit(float(max((abs(r.delta_bytes) for r in rows), default=0)) or None)
    fig = base_figure(f"What grew from A to B: {_signed(diff.allocated_delta)} allocated", height=120 + 28 * len(rows),
                      xaxis_title="change in live bytes", yaxis_title="")
    labels = [f"{i + 1}. {plot_text(r.top, 70)}" for i, r in enumerate(rows)]
    fig.add_trace({"type": "bar", "orientation": "h", "y": labels[::-1],
                   "x": [r.delta_bytes / scale for r in rows[::-1]],
                   "marker": {"color": ["#e45756" if r.delta_bytes > 0 else "#54a24b" for r in rows[::-1]]},
                   "text": [f"{_signed(r.delta_bytes)} ({r.before_count:,} -> {r.after_count:,})" for r in rows[::-1]],
                   "hovertext": ["<br>".join(plot_text(f, 160) for f in r.stack.split("\n")) for r in rows[::-1]],
                   "hoverinfo": "text", "textposition": "auto", "name": "change"})
    fig.update_layout(margin={"l": 320, "r": 30, "t": 50, "b": 40}, showlegend=False)
    fig.update_xaxes(**unit_axis(unit))
    return fig


def _totals(diff: SnapshotDiff) -> html.Table:
    a, b = diff.before, diff.after

    def name(t: Any) -> str:
        return ((f"step {t.step}" if t.step is not None else "") + (f" ({t.label})" if t.label else "")).strip()

    head = html.Tr([html.Th(""), html.Th(f"A: {name(a) or 'snapshot'}"), html.Th(f"B: {name(b) or 'snapshot'}"),
                    html.Th("change")])
    body = [html.Tr([html.Td(label), html.Td(human_bytes(x)), html.Td(human_bytes(y)), html.Td(_signed(y - x))])
            for label, x, y in (("allocated", a.allocated_bytes, b.allocated_bytes),
                                ("reserved", a.reserved_bytes, b.reserved_bytes), ("free", a.free_bytes, b.free_bytes),
                                ("largest free block", a.largest_free_bytes, b.largest_free_bytes))]
    body.append(html.Tr([html.Td("live allocations"), html.Td(f"{a.live:,}"), html.Td(f"{b.live:,}"),
                         html.Td(f"{b.live - a.live:+,}")]))
    return html.Table([html.Thead(head), html.Tbody(body)], id="snapshot-diff-totals", className="table")


def diff_children(maps: list[Any], before: Any, after: Any, graph_config: Any = None) -> list[Any]:
    """A (``before``) and B (``after``) side by side: totals, what grew by stack (chart and table)."""
    if before is None or after is None:
        return [note("snapshot diff: pick a snapshot to compare with (A) above; B is the one shown")]
    if before is after:
        return [note("snapshot diff: A and B are the same snapshot; pick another to compare with")]
    diff = snapshot_diff(before, after)
    parts: list[Any] = [html.H4("Snapshot diff: A (compare with) against B (shown)"), _totals(diff)]
    if not diff.rows:
        parts.append(note("no live allocation changed between A and B"))
        return parts
    parts.append(dcc.Graph(id="snapshot-diff-graph", figure=diff_figure(diff), config=graph_config))
    head = html.Tr([html.Th("change"), html.Th("A"), html.Th("B"), html.Th("allocations"), html.Th("stack")])
    body = [html.Tr([html.Td(_signed(r.delta_bytes)), html.Td(human_bytes(r.before_bytes)), html.Td(human_bytes(r.after_bytes)),
                     html.Td(f"{r.before_count:,} -> {r.after_count:,}"), html.Td(_frames(r.stack))]) for r in diff.rows]
    parts.append(html.Table([html.Thead(head), html.Tbody(body)], id="snapshot-diff-table", className="table"))
    if diff.more:
        parts.append(note(f"{diff.more:,} more stacks changed"))
    return parts
