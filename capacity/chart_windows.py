"""The maintenance windows on the operator charts: a shaded band on the pool timeline, a row on the Gantt.

Kept apart from `capacity.charts` (which calls these, passing its plot
geometry: `left`, `top`, `width`, `height` or `bottom`, `x_of`) so each module
stays small; the windows are anything with a reason and a span, e.g.
`reservations.maintenance.windows.WindowRef` or `operations.selectors.GanttWindow`.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

# The amber, crossed fill of a maintenance window's bars, on both charts.
MAINTENANCE_FILL = (
    '<pattern id="{id}" width="6" height="6" patternUnits="userSpaceOnUse">'
    '<rect width="6" height="6" fill="#d97706"/>'
    '<path d="M0,3 L6,3 M3,0 L3,6" stroke="#fff" stroke-width="1"/>'
    "</pattern>"
)
# The height of the windows' strip above the timeline's plot.
TIMELINE_STRIP = 16


def timeline_windows(plot: Any, buckets: list[dict[str, Any]], windows: Sequence[Any]) -> list[str]:
    """A band behind the columns for each maintenance window, clipped to the chart, its reason on top."""
    if not buckets or not windows:
        return []
    lo, hi = int(buckets[0]["start"]), int(buckets[-1]["end"])
    span = (hi - lo) or 1
    out = []
    for window in windows:
        start = max(lo, int(window.starts_at.timestamp() * 1000))
        end = min(hi, int(window.ends_at.timestamp() * 1000))
        if end <= start:
            continue
        x0 = plot.left + plot.width * (start - lo) / span
        w = max(plot.width * (end - start) / span, 1.0)
        nodes = len(window.node_ids)
        words = (
            f"maintenance window: {window.reason} on {nodes} node{'' if nodes == 1 else 's'},"
            f" {window.starts_at:%m-%d %H:%M} to {window.ends_at:%m-%d %H:%M}"
        )
        out.append(
            f'<rect class="tl-window" x="{x0:.2f}" y="{plot.top}" width="{w:.2f}" height="{plot.height}"'
            f' fill="#fde68a" fill-opacity="0.45" stroke="#d97706" stroke-dasharray="3 2">'
            f"<title>{escape(words)}</title></rect>"
            f'<rect x="{x0:.2f}" y="{plot.top - 14 - TIMELINE_STRIP}" width="{w:.2f}" height="12"'
            ' fill="url(#tl-maintenance)"/>'
            f'<text class="tl-window-label" x="{x0 + 3:.2f}" y="{plot.top - 4 - TIMELINE_STRIP}"'
            ' font-size="10"'
            ' font-weight="bold" fill="#111" stroke="#fff" stroke-width="3" paint-order="stroke">'
            f"{escape(window.reason[:60])}</text>"
        )
    return out


# The space between the windows' row and the atoms: room for the "now" label.
WINDOW_LANE_GAP = 18


def gantt_windows(plot: Any, windows: list[Any]) -> list[str]:
    """The maintenance windows' row above the atoms: one bar each, with its reason; a band over the rows."""
    if not windows:
        return []
    y = plot.top - plot.row_h - WINDOW_LANE_GAP
    out = [
        f'<text x="{plot.left - 6}" y="{y + plot.row_h - 4}" font-size="10" text-anchor="end" '
        'font-weight="bold" fill="#92400e">maintenance windows</text>'
    ]
    for window in windows:
        start, end = max(window.start, plot.start), min(window.end, plot.end)
        if end <= start:
            continue
        x0, x1 = plot.x_of(start), plot.x_of(end)
        w = max(x1 - x0, 1.0)
        span = f"{window.start:%m-%d %H:%M} to {window.end:%m-%d %H:%M}"
        out.append(
            f'<rect class="gantt-window-band" x="{x0:.2f}" y="{plot.top}" width="{w:.2f}"'
            f' height="{plot.bottom - plot.top}" fill="#fde68a" fill-opacity="0.35"/>'
            f'<rect class="gantt-window" x="{x0:.2f}" y="{y}" width="{w:.2f}" height="{plot.row_h}"'
            f' fill="url(#gantt-maintenance)" stroke="#92400e">'
            f"<title>maintenance window: {escape(window.reason)} ({escape(window.window_id)}), {span}"
            "</title></rect>"
            f'<text class="gantt-window-label" x="{x0 + 4:.2f}" y="{y + plot.row_h - 4}" font-size="10"'
            ' font-weight="bold" fill="#111" stroke="#fff" stroke-width="3" paint-order="stroke">'
            f"{escape(window.reason[:60])}</text>"
        )
    return out
