"""Server-rendered SVG charts for the operator admin.

No JavaScript and no build step: the admin pages embed these strings. Every
segment carries a pattern as well as a colour, a `<title>` for hover, and the
numbers are printed as text, so a chart reads in greyscale, printed, or with a
screen reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe


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


def timeline_svg(*, timeline: dict[str, Any], width: int = 860, height: int = 260) -> SafeString:
    """Booked vs free GPUs per time bucket, as stacked columns with the allocatable line.

    `timeline` is what `capacity.selectors.timeline.timeline_compute` returns:
    `{"allocatable": int, "buckets": [{"start", "end", "booked", "free"}]}` with
    times in epoch milliseconds.
    """
    buckets = list(timeline.get("buckets") or [])
    allocatable = int(timeline.get("allocatable") or 0)
    left, right, top, bottom = 44, 12, 36, 46
    plot_w = width - left - right
    plot_h = height - top - bottom
    peak = max([allocatable] + [int(b.get("booked", 0)) + int(b.get("free", 0)) for b in buckets] + [1])
    out = [
        f'<svg class="timeline-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">',
        f"<title>GPUs booked and free per time bucket; {allocatable} allocatable</title>",
        '<defs><pattern id="tl-booked" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#2563eb"/><path d="M0,6 L6,0" stroke="#fff" stroke-width="1.3"/>'
        '</pattern><pattern id="tl-free" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#dcfce7"/><circle cx="3" cy="3" r="1.1" fill="#16a34a"/>'
        "</pattern></defs>",
    ]
    # Axes and gridlines at quarters of the peak, labelled with GPU counts.
    for i in range(5):
        value = round(peak * i / 4)
        y = top + plot_h - plot_h * value / peak
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e5e7eb"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#374151">'
            f"{value}</text>"
        )
    out.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#374151"/>'
    )
    if not buckets:
        out.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" font-size="13" text-anchor="middle" '
            f'fill="#374151">No timeline data</text>'
        )
    n = len(buckets)
    slot = plot_w / n if n else plot_w
    bar_w = max(1.0, slot * 0.8)
    label_every = max(1, n // 8)
    for i, b in enumerate(buckets):
        booked, free = int(b.get("booked", 0)), int(b.get("free", 0))
        x = left + i * slot + (slot - bar_w) / 2
        h_booked = plot_h * booked / peak
        h_free = plot_h * free / peak
        y_booked = top + plot_h - h_booked
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
                f'<text x="{x + bar_w / 2:.2f}" y="{top + plot_h + 14}" font-size="10" '
                f'text-anchor="middle" fill="#374151">{_fmt_ms(int(b["start"]))}</text>'
            )
    if allocatable:
        y = top + plot_h - plot_h * allocatable / peak
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#111" '
            f'stroke-width="1.5" stroke-dasharray="6 3"/>'
            f'<text x="{left + plot_w}" y="{y - 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="#111">allocatable {allocatable}</text>'
        )
    # Legend: pattern swatches and words, so it reads without colour.
    ly = height - 12
    out.append(
        f'<rect x="{left}" y="{ly - 10}" width="12" height="12" fill="url(#tl-booked)"/>'
        f'<text x="{left + 16}" y="{ly}" font-size="11" fill="#111">booked GPUs (hatched)</text>'
        f'<rect x="{left + 170}" y="{ly - 10}" width="12" height="12" fill="url(#tl-free)" stroke="#16a34a"/>'
        f'<text x="{left + 186}" y="{ly}" font-size="11" fill="#111">free GPUs (dotted)</text>'
        f'<line x1="{left + 320}" y1="{ly - 4}" x2="{left + 344}" y2="{ly - 4}" stroke="#111" '
        f'stroke-width="1.5" stroke-dasharray="6 3"/>'
        f'<text x="{left + 350}" y="{ly}" font-size="11" fill="#111">allocatable now (dashed)</text>'
        f'<text x="{left}" y="14" font-size="12" font-weight="bold" fill="#111">GPUs per bucket (UTC)</text>'
    )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - numbers and fixed labels only


def gantt_svg(*, gantt: Any, width: int = 860) -> SafeString:
    """A node's atoms as rows and their bookings as bars over the window (`node_selectors.node_gantt`).

    A bar's fill says what holds the atom: a regular reservation (solid blue),
    a spot one (hatched purple) or a layout change (grey); a reservation at
    risk gets a thick red outline. Each bar's `<title>` names the reservation,
    its tenant, its state and its window; a dashed line marks now.
    """
    rows = list(gantt.atoms)
    left, right, top, row_h = 190, 12, 34, 16
    plot_w = width - left - right
    height = top + row_h * max(len(rows), 1) + 44
    span = (gantt.end - gantt.start).total_seconds() or 1.0

    def x_of(moment: datetime) -> float:
        return left + plot_w * (moment - gantt.start).total_seconds() / span

    out = [
        f'<svg class="gantt-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">',
        f"<title>Bookings of {len(rows)} atoms from {gantt.start:%Y-%m-%d %H:%M}"
        f" to {gantt.end:%Y-%m-%d %H:%M} UTC</title>",
        '<defs><pattern id="gantt-spot" width="6" height="6" patternUnits="userSpaceOnUse">'
        '<rect width="6" height="6" fill="#7c3aed"/><path d="M0,6 L6,0" stroke="#fff" stroke-width="1.3"/>'
        "</pattern></defs>",
        f'<text x="{left}" y="14" font-size="12" font-weight="bold" fill="#111">'
        "Bookings per atom (UTC)</text>",
    ]
    index = {uid: i for i, (uid, _) in enumerate(rows)}
    for i, (uid, device_class) in enumerate(rows):
        y = top + i * row_h
        out.append(
            f'<rect x="{left}" y="{y}" width="{plot_w}" height="{row_h - 2}"'
            f' fill="{"#f9fafb" if i % 2 else "#fff"}"/>'
            f'<text x="{left - 6}" y="{y + row_h - 5}" font-size="10" text-anchor="end" fill="#374151">'
            f"{escape(uid[-28:])} ({escape(device_class)})</text>"
        )
    for tick in range(5):
        moment = gantt.start + (gantt.end - gantt.start) * tick / 4
        x = x_of(moment)
        bottom = top + row_h * max(len(rows), 1)
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#e5e7eb"/>'
            f'<text x="{x:.1f}" y="{bottom + 14}" font-size="10"'
            f' text-anchor="{("start", "middle", "middle", "middle", "end")[tick]}" fill="#374151">'
            f"{moment:%m-%d %H:%M}</text>"
        )
    for bar in gantt.bars:
        y = top + index[bar.uid] * row_h + 1
        x0, x1 = x_of(bar.start), x_of(bar.end)
        if bar.reservation_id is None:
            fill, kind = "#9ca3af", "layout change"
        elif bar.spot:
            fill, kind = "url(#gantt-spot)", "spot"
        else:
            fill, kind = "#2563eb", "regular"
        outline = ' stroke="#dc2626" stroke-width="2.5"' if bar.at_risk else ""
        who = f"{bar.reservation_id} ({bar.tenant_id})" if bar.reservation_id else "layout change"
        risk = ", at risk" if bar.at_risk else ""
        out.append(
            f'<rect class="gantt-bar gantt-{kind.replace(" ", "-")}{" gantt-at-risk" if bar.at_risk else ""}"'
            f' x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 1.0):.2f}" height="{row_h - 4}"'
            f' fill="{fill}"{outline}>'
            f"<title>{escape(bar.uid)}: {escape(who)}, {escape(bar.state)}, {kind}{risk},"
            f" {bar.start:%m-%d %H:%M} to {bar.end:%m-%d %H:%M}</title></rect>"
        )
    if gantt.start <= gantt.now <= gantt.end:
        x = x_of(gantt.now)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + row_h * max(len(rows), 1)}" '
            f'stroke="#111" stroke-width="1.2" stroke-dasharray="4 3"/>'
            f'<text x="{x:.1f}" y="{top - 8}" font-size="10" text-anchor="middle" fill="#111">now</text>'
        )
    ly = height - 10
    out.append(
        f'<rect x="{left}" y="{ly - 10}" width="12" height="12" fill="#2563eb"/>'
        f'<text x="{left + 16}" y="{ly}" font-size="11" fill="#111">regular (solid)</text>'
        f'<rect x="{left + 120}" y="{ly - 10}" width="12" height="12" fill="url(#gantt-spot)"/>'
        f'<text x="{left + 136}" y="{ly}" font-size="11" fill="#111">spot (hatched)</text>'
        f'<rect x="{left + 240}" y="{ly - 10}" width="12" height="12" fill="#9ca3af"/>'
        f'<text x="{left + 256}" y="{ly}" font-size="11" fill="#111">layout change (grey)</text>'
        f'<rect x="{left + 390}" y="{ly - 10}" width="12" height="12" fill="#fff" stroke="#dc2626"'
        ' stroke-width="2.5"/>'
        f'<text x="{left + 406}" y="{ly}" font-size="11" fill="#111">at risk (red outline)</text>'
    )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - every text from the database is escaped
