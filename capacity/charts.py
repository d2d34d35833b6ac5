"""Server-rendered SVG charts for the operator admin.

No JavaScript and no build step: the admin pages embed these strings. Every
segment carries a pattern as well as a colour, a `<title>` for hover, and the
numbers are printed as text, so a chart reads in greyscale, printed, or with a
screen reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from capacity.chart_windows import (
    MAINTENANCE_FILL,
    TIMELINE_STRIP,
    WINDOW_LANE_GAP,
    gantt_windows,
    timeline_windows,
)


@dataclass(frozen=True)
class Segment:
    """One kind of capacity in a bar: its key, label, fill colour and pattern id."""

    key: str
    label: str
    colour: str
    pattern: str


# Order matters: usable capacity first (allocated, reserved, available), then
# the four buckets that explain why the rest is not allocatable.
SEGMENTS: tuple[Segment, ...] = (
    Segment("allocated", "allocated", "#2563eb", "solid"),
    Segment("reserved", "reserved", "#7c3aed", "hatch"),
    Segment("available", "available", "#16a34a", "dots"),
    Segment("maintenance", "maintenance", "#d97706", "cross"),
    Segment("unhealthy", "unhealthy", "#dc2626", "vlines"),
    Segment("unreachable", "unreachable", "#6b7280", "hlines"),
    Segment("provisioning", "provisioning", "#0891b2", "rhatch"),
)


def _pattern_defs(prefix: str) -> str:
    """SVG patterns layered over each colour, so segments differ without colour too."""
    defs = []
    for seg in SEGMENTS:
        pid = f"{prefix}-{seg.key}"
        mark = {
            "solid": "",
            "hatch": '<path d="M0,6 L6,0" stroke="#fff" stroke-width="1.5"/>',
            "rhatch": '<path d="M0,0 L6,6" stroke="#fff" stroke-width="1.5"/>',
            "dots": '<circle cx="3" cy="3" r="1.2" fill="#fff"/>',
            "cross": '<path d="M0,3 L6,3 M3,0 L3,6" stroke="#fff" stroke-width="1"/>',
            "vlines": '<path d="M3,0 L3,6" stroke="#fff" stroke-width="1.5"/>',
            "hlines": '<path d="M0,3 L6,3" stroke="#fff" stroke-width="1.5"/>',
        }[seg.pattern]
        defs.append(
            f'<pattern id="{pid}" width="6" height="6" patternUnits="userSpaceOnUse">'
            f'<rect width="6" height="6" fill="{seg.colour}"/>{mark}</pattern>'
        )
    return "<defs>" + "".join(defs) + "</defs>"


def rollup_segments(*, row: Any) -> list[tuple[Segment, int]]:
    """The bar's (segment, value) pairs for a rollup row (or anything with the same attributes)."""
    return [(seg, max(0, int(getattr(row, seg.key, 0) or 0))) for seg in SEGMENTS]


def rollup_bar_svg(*, row: Any, width: int = 320, height: int = 18, legend: bool = True) -> SafeString:
    """A stacked bar of one rollup row: allocated, reserved, available, then the buckets.

    `available` is conservative (an atom booked now and later counts twice), so
    the three usable segments may not add up to `allocatable`; the bar scales to
    what it draws, and the text says the real numbers.
    """
    parts = rollup_segments(row=row)
    scale_total = sum(v for _, v in parts)
    prefix = "cbar"
    svg_h = height + (18 if legend else 0)
    out = [
        f'<svg class="capacity-bar" role="img" width="{width}" height="{svg_h}" '
        f'viewBox="0 0 {width} {svg_h}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(_bar_summary(row))}</title>",
        _pattern_defs(prefix),
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f3f4f6" stroke="#9ca3af"/>',
    ]
    x = 0.0
    for seg, value in parts:
        if not value or not scale_total:
            continue
        w = width * value / scale_total
        out.append(
            f'<rect class="seg-{seg.key}" x="{x:.2f}" y="0" width="{w:.2f}" height="{height}" '
            f'fill="url(#{prefix}-{seg.key})" stroke="#fff" stroke-width="0.5">'
            f"<title>{seg.label}: {value}</title></rect>"
        )
        if w >= 22:
            out.append(
                f'<text x="{x + w / 2:.2f}" y="{height - 5}" font-size="11" font-family="sans-serif" '
                f'text-anchor="middle" font-weight="bold" fill="#111" stroke="#fff" stroke-width="3" '
                f'paint-order="stroke">{value}</text>'
            )
        x += w
    if legend:
        out.append(
            f'<text x="0" y="{height + 14}" font-size="11" font-family="sans-serif" fill="#111">'
            f"{escape(_bar_summary(row))}</text>"
        )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - built from integers and fixed labels only


def _bar_summary(row: Any) -> str:
    """The bar in words: the usable numbers, then every non-empty bucket."""
    text = (
        f"{row.allocated} allocated · {row.reserved} reserved · {row.available} available"
        f" of {row.allocatable} allocatable"
    )
    buckets = [f"{getattr(row, seg.key)} {seg.label}" for seg in SEGMENTS[3:] if getattr(row, seg.key, 0)]
    if buckets:
        text += " · " + " · ".join(buckets)
    return f"{text} ({row.total} total)"


def legend_html() -> SafeString:
    """A legend for the bars: swatch with the same pattern, and the name in words."""
    items = []
    for seg in SEGMENTS:
        swatch = (
            f'<svg width="14" height="14" aria-hidden="true" xmlns="http://www.w3.org/2000/svg">'
            f"{_pattern_defs('lg-' + seg.key)}"
            f'<rect width="14" height="14" fill="url(#lg-{seg.key}-{seg.key})" stroke="#374151"/></svg>'
        )
        items.append(f'<span class="legend-item">{swatch} {seg.label}</span>')
    return mark_safe('<div class="capacity-legend">' + "".join(items) + "</div>")  # noqa: S308


def _fmt_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%m-%d %H:%M")


@dataclass(frozen=True)
class _TimelinePlot:
    """Where the timeline's plot area sits in the SVG, and the GPU count its top stands for."""

    left: int
    top: int
    width: int
    height: int
    peak: int

    @property
    def bottom(self) -> int:
        return self.top + self.height

    def y_of(self, value: float) -> float:
        return self.bottom - self.height * value / self.peak


def timeline_svg(
    *, timeline: dict[str, Any], windows: Sequence[Any] = (), width: int = 860, height: int = 260
) -> SafeString:
    """Booked vs free GPUs per time bucket, as stacked columns with the allocatable line.

    `timeline` is what `capacity.selectors.timeline.timeline_compute` returns:
    `{"allocatable": int, "buckets": [{"start", "end", "booked", "free"}]}` with
    times in epoch milliseconds. `windows` are the maintenance windows overlapping
    it (anything with `reason`, `starts_at`, `ends_at`, `node_ids`, e.g.
    `reservations.maintenance.windows.WindowRef`): each is a shaded, labelled band.
    """
    buckets = list(timeline.get("buckets") or [])
    allocatable = int(timeline.get("allocatable") or 0)
    # With windows, a strip above the plot carries their reasons, clear of the columns' numbers.
    left, right, top, bottom = 44, 12, 36 + (TIMELINE_STRIP if windows else 0), 46
    peak = max([allocatable] + [int(b.get("booked", 0)) + int(b.get("free", 0)) for b in buckets] + [1])
    plot = _TimelinePlot(left, top, width - left - right, height - top - bottom, peak)
    out = [
        f'<svg class="timeline-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">',
        f"<title>GPUs booked and free per time bucket; {allocatable} allocatable</title>",
        '<defs><pattern id="tl-booked" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#2563eb"/><path d="M0,6 L6,0" stroke="#fff" stroke-width="1.3"/>'
        '</pattern><pattern id="tl-free" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#dcfce7"/><circle cx="3" cy="3" r="1.1" fill="#16a34a"/>'
        "</pattern></defs>",
        MAINTENANCE_FILL.format(id="tl-maintenance").join(("<defs>", "</defs>")) if windows else "",
        *_timeline_axes(plot, empty=not buckets),
        *timeline_windows(plot, buckets, windows),
        *_timeline_columns(plot, buckets),
        *_timeline_allocatable(plot, allocatable),
        _timeline_legend(left, height - 12, windows=bool(windows)),
        "</svg>",
    ]
    return mark_safe("".join(out))  # noqa: S308 - numbers and fixed labels only


def _timeline_axes(plot: _TimelinePlot, *, empty: bool) -> list[str]:
    """Gridlines at quarters of the peak, labelled with GPU counts, and the base line."""
    out = []
    for i in range(5):
        value = round(plot.peak * i / 4)
        y = plot.y_of(value)
        out.append(
            f'<line x1="{plot.left}" y1="{y:.1f}" x2="{plot.left + plot.width}" y2="{y:.1f}"'
            ' stroke="#e5e7eb"/>'
            f'<text x="{plot.left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#374151">'
            f"{value}</text>"
        )
    out.append(
        f'<line x1="{plot.left}" y1="{plot.bottom}" x2="{plot.left + plot.width}" y2="{plot.bottom}"'
        ' stroke="#374151"/>'
    )
    if empty:
        out.append(
            f'<text x="{plot.left + plot.width / 2}" y="{plot.top + plot.height / 2}" font-size="13" '
            f'text-anchor="middle" fill="#374151">No timeline data</text>'
        )
    return out


def _timeline_columns(plot: _TimelinePlot, buckets: list[dict[str, Any]]) -> list[str]:
    """One column per bucket: booked (hatched) under free (dotted), with its start time below."""
    out = []
    n = len(buckets)
    slot = plot.width / n if n else plot.width
    bar_w = max(1.0, slot * 0.8)
    label_every = max(1, n // 8)
    for i, b in enumerate(buckets):
        booked, free = int(b.get("booked", 0)), int(b.get("free", 0))
        x = plot.left + i * slot + (slot - bar_w) / 2
        h_booked = plot.height * booked / plot.peak
        h_free = plot.height * free / plot.peak
        y_booked = plot.bottom - h_booked
        span = f"{_fmt_ms(int(b['start']))} to {_fmt_ms(int(b['end']))}"
        out.append(
            f'<rect class="tl-booked" x="{x:.2f}" y="{y_booked:.2f}" width="{bar_w:.2f}" '
            f'height="{h_booked:.2f}" fill="url(#tl-booked)"><title>{span}: {booked} booked</title></rect>'
            f'<rect class="tl-free" x="{x:.2f}" y="{y_booked - h_free:.2f}" width="{bar_w:.2f}" '
            f'height="{h_free:.2f}" fill="url(#tl-free)" stroke="#16a34a" stroke-width="0.5">'
            f"<title>{span}: {free} free</title></rect>"
        )
        if n <= 24 and bar_w >= 14 and booked:
            out.append(
                f'<text x="{x + bar_w / 2:.2f}" y="{y_booked - 3:.2f}" font-size="10" font-weight="bold" '
                f'text-anchor="middle" fill="#111" stroke="#fff" stroke-width="3" paint-order="stroke">'
                f"{booked}</text>"
            )
        if i % label_every == 0:
            out.append(
                f'<text x="{x + bar_w / 2:.2f}" y="{plot.bottom + 14}" font-size="10" '
                f'text-anchor="middle" fill="#374151">{_fmt_ms(int(b["start"]))}</text>'
            )
    return out


def _timeline_allocatable(plot: _TimelinePlot, allocatable: int) -> list[str]:
    """The dashed allocatable line across the plot, with its number; none when nothing is allocatable."""
    if not allocatable:
        return []
    y = plot.y_of(allocatable)
    return [
        f'<line x1="{plot.left}" y1="{y:.1f}" x2="{plot.left + plot.width}" y2="{y:.1f}" stroke="#111" '
        f'stroke-width="1.5" stroke-dasharray="6 3"/>'
        f'<text x="{plot.left + plot.width}" y="{y - 4:.1f}" font-size="11" text-anchor="end" '
        f'fill="#111">allocatable {allocatable}</text>'
    ]


# Legend entries: (x after the plot's left edge, the square's fill and stroke, the words).
_TIMELINE_LEGEND = (
    (0, 'fill="url(#tl-booked)"', "booked GPUs (hatched)"),
    (170, 'fill="url(#tl-free)" stroke="#16a34a"', "free GPUs (dotted)"),
)
_GANTT_LEGEND = (
    (0, 'fill="#2563eb"', "regular (solid)"),
    (120, 'fill="url(#gantt-spot)"', "spot (hatched)"),
    (240, 'fill="#9ca3af"', "layout change (grey)"),
    (390, 'fill="#fff" stroke="#dc2626" stroke-width="2.5"', "at risk (red outline)"),
    (530, 'fill="url(#gantt-maintenance)"', "maintenance window"),
)


def _legend(left: int, ly: int, entries: tuple[tuple[int, str, str], ...]) -> str:
    """Legend entries on the line at `ly`: a 12 px square each, patterned as its bars, and its words."""
    return "".join(
        f'<rect x="{left + dx}" y="{ly - 10}" width="12" height="12" {swatch}/>'
        f'<text x="{left + dx + 16}" y="{ly}" font-size="11" fill="#111">{label}</text>'
        for dx, swatch, label in entries
    )


def _timeline_legend(left: int, ly: int, *, windows: bool = False) -> str:
    """The legend and the chart's heading: pattern swatches and words, so it reads without colour."""
    band = (
        f'<rect x="{left + 520}" y="{ly - 10}" width="12" height="12" fill="url(#tl-maintenance)"/>'
        f'<text x="{left + 536}" y="{ly}" font-size="11" fill="#111">maintenance window (shaded)</text>'
        if windows
        else ""
    )
    return (
        band
        + _legend(left, ly, _TIMELINE_LEGEND)
        + f'<line x1="{left + 320}" y1="{ly - 4}" x2="{left + 344}" y2="{ly - 4}" stroke="#111" '
        f'stroke-width="1.5" stroke-dasharray="6 3"/>'
        f'<text x="{left + 350}" y="{ly}" font-size="11" fill="#111">allocatable now (dashed)</text>'
        f'<text x="{left}" y="14" font-size="12" font-weight="bold" fill="#111">GPUs per bucket (UTC)</text>'
    )


@dataclass(frozen=True)
class _GanttPlot:
    """Where the booking chart's rows sit, and the window its width stands for."""

    left: int
    top: int
    width: int
    row_h: int
    rows: int
    start: datetime
    end: datetime

    @property
    def bottom(self) -> int:
        return self.top + self.row_h * max(self.rows, 1)

    def x_of(self, moment: datetime) -> float:
        span = (self.end - self.start).total_seconds() or 1.0
        return self.left + self.width * (moment - self.start).total_seconds() / span


def gantt_svg(*, gantt: Any, width: int = 860) -> SafeString:
    """A node's atoms as rows and their bookings as bars over the window (`operations.selectors.node_gantt`).

    A bar's fill says what holds the atom: a regular reservation (solid blue),
    a spot one (hatched purple), a layout change (grey) or a maintenance
    window (amber, crossed); a reservation at risk gets a thick red outline.
    Each bar's `<title>` names the reservation, its tenant, its state and its
    window; a dashed line marks now. The node's maintenance windows also get a
    row of their own above the atoms, each bar labelled with its reason.
    """
    rows = list(gantt.atoms)
    windows = list(getattr(gantt, "windows", []))
    left, right, row_h = 190, 12, 16
    top = 34 + (row_h + WINDOW_LANE_GAP if windows else 0)
    plot = _GanttPlot(left, top, width - left - right, row_h, len(rows), gantt.start, gantt.end)
    height = plot.bottom + 44
    index = {uid: i for i, (uid, _) in enumerate(rows)}
    out = [
        f'<svg class="gantt-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">',
        f"<title>Bookings of {len(rows)} atoms from {gantt.start:%Y-%m-%d %H:%M}"
        f" to {gantt.end:%Y-%m-%d %H:%M} UTC</title>",
        '<defs><pattern id="gantt-spot" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#7c3aed"/><path d="M0,6 L6,0" stroke="#fff" stroke-width="1.3"/>'
        f"</pattern>{MAINTENANCE_FILL.format(id='gantt-maintenance')}</defs>",
        f'<text x="{left}" y="14" font-size="12" font-weight="bold" fill="#111">'
        "Bookings per atom (UTC)</text>",
        *_gantt_rows(plot, rows),
        *gantt_windows(plot, windows),
        *_gantt_ticks(plot),
        *(_gantt_bar(plot, bar, row=index[bar.uid]) for bar in gantt.bars),
        *_gantt_now(plot, gantt.now),
        _legend(left, height - 10, _GANTT_LEGEND),
        "</svg>",
    ]
    return mark_safe("".join(out))  # noqa: S308 - every text from the database is escaped


def _gantt_rows(plot: _GanttPlot, rows: list[tuple[str, str]]) -> list[str]:
    """A striped row per atom, labelled with the end of its uid and its class."""
    out = []
    for i, (uid, device_class) in enumerate(rows):
        y = plot.top + i * plot.row_h
        out.append(
            f'<rect x="{plot.left}" y="{y}" width="{plot.width}" height="{plot.row_h - 2}"'
            f' fill="{"#f9fafb" if i % 2 else "#fff"}"/>'
            f'<text x="{plot.left - 6}" y="{y + plot.row_h - 5}" font-size="10" text-anchor="end"'
            ' fill="#374151">'
            f"{escape(uid[-28:])} ({escape(device_class)})</text>"
        )
    return out


def _gantt_ticks(plot: _GanttPlot) -> list[str]:
    """Five time gridlines across the window, each with its time below the rows."""
    out = []
    for tick in range(5):
        moment = plot.start + (plot.end - plot.start) * tick / 4
        x = plot.x_of(moment)
        out.append(
            f'<line x1="{x:.1f}" y1="{plot.top}" x2="{x:.1f}" y2="{plot.bottom}" stroke="#e5e7eb"/>'
            f'<text x="{x:.1f}" y="{plot.bottom + 14}" font-size="10"'
            f' text-anchor="{("start", "middle", "middle", "middle", "end")[tick]}" fill="#374151">'
            f"{moment:%m-%d %H:%M}</text>"
        )
    return out


def _gantt_bar(plot: _GanttPlot, bar: Any, *, row: int) -> str:
    """One booking: its fill says what holds the atom, its `<title>` who, in what state, when."""
    y = plot.top + row * plot.row_h + 1
    x0, x1 = plot.x_of(bar.start), plot.x_of(bar.end)
    window_id = getattr(bar, "window_id", None)
    if window_id is not None:
        fill, kind = "url(#gantt-maintenance)", "maintenance"
    elif bar.reservation_id is None:
        fill, kind = "#9ca3af", "layout change"
    elif bar.spot:
        fill, kind = "url(#gantt-spot)", "spot"
    else:
        fill, kind = "#2563eb", "regular"
    outline = ' stroke="#dc2626" stroke-width="2.5"' if bar.at_risk else ""
    if window_id is not None:
        who = f"maintenance window: {bar.window_reason} ({window_id})"
    else:
        who = f"{bar.reservation_id} ({bar.tenant_id})" if bar.reservation_id else "layout change"
    risk = ", at risk" if bar.at_risk else ""
    return (
        f'<rect class="gantt-bar gantt-{kind.replace(" ", "-")}{" gantt-at-risk" if bar.at_risk else ""}"'
        f' x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 1.0):.2f}" height="{plot.row_h - 4}"'
        f' fill="{fill}"{outline}>'
        f"<title>{escape(bar.uid)}: {escape(who)}, {escape(bar.state)}, {kind}{risk},"
        f" {bar.start:%m-%d %H:%M} to {bar.end:%m-%d %H:%M}</title></rect>"
    )


def _gantt_now(plot: _GanttPlot, now: datetime) -> list[str]:
    """The dashed line at now, when now is inside the window."""
    if not plot.start <= now <= plot.end:
        return []
    x = plot.x_of(now)
    return [
        f'<line x1="{x:.1f}" y1="{plot.top - 4}" x2="{x:.1f}" y2="{plot.bottom}" '
        f'stroke="#111" stroke-width="1.2" stroke-dasharray="4 3"/>'
        f'<text x="{x:.1f}" y="{plot.top - 8}" font-size="10" text-anchor="middle" fill="#111">now</text>'
    ]
