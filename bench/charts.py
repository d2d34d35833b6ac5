"""The benchmark page's charts: PNGs drawn with matplotlib (Agg), one per section of `docs/benchmarks.md`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.targets import EARLIEST_P50_MS, PREVIEW_8_P50_MS, READ_P50_MS


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _chart_latencies(
    path: Path,
    by_size: dict[str, dict[str, Any]],
    names: list[str],
    *,
    title: str,
    target_ms: float,
    figsize: tuple[float, float],
    dash: int,
    **ticks: Any,
) -> None:
    """Grouped bars: per name, one bar (p50) and one dash (p99) per fleet size; the target dotted."""
    fig, ax = plt.subplots(figsize=figsize)
    width = 0.8 / len(by_size)
    for k, (size, latencies) in enumerate(by_size.items()):
        xs = [i + k * width for i in range(len(names))]
        ax.bar(xs, [latencies[n]["p50_ms"] for n in names], width, label=f"{int(size):,} nodes p50")
        ax.scatter(xs, [latencies[n]["p99_ms"] for n in names], marker="_", s=dash, color="black", zorder=3)
    ax.set_xticks([i + width * (len(by_size) - 1) / 2 for i in range(len(names))], names, **ticks)
    ax.set_ylabel("ms (bar p50, dash p99)")
    ax.set_title(title)
    ax.axhline(target_ms, color="grey", linestyle=":", linewidth=1)
    ax.legend(fontsize=8)
    _save(fig, path)


def chart_reads(results: dict[str, Any], path: Path) -> None:
    _chart_latencies(
        path,
        {size: run["reads"] for size, run in results["sizes"].items()},
        ["summary", "byPool", "timeline"],
        title="Capacity reads over HTTP",
        target_ms=READ_P50_MS,
        figsize=(7, 3.6),
        dash=300,
    )


def _chart_shapes(
    results: dict[str, Any], path: Path, method: str, *, title: str, target_ms: float, rotation: int
) -> None:
    """One planning method's request shapes (`reads[method]`), as the first size names them."""
    by_size = {size: run["reads"][method] for size, run in results["sizes"].items()}
    _chart_latencies(
        path,
        by_size,
        list(next(iter(by_size.values()))),
        title=title,
        target_ms=target_ms,
        figsize=(8, 3.8),
        dash=200,
        rotation=rotation,
        fontsize=8,
    )


def chart_preview(results: dict[str, Any], path: Path) -> None:
    _chart_shapes(
        results, path, "preview", title="capacity/preview over HTTP", target_ms=PREVIEW_8_P50_MS, rotation=20
    )


def chart_earliest(results: dict[str, Any], path: Path) -> None:
    _chart_shapes(
        results,
        path,
        "earliest",
        title="capacity/earliest over HTTP (7-day horizon)",
        target_ms=EARLIEST_P50_MS,
        rotation=10,
    )


def chart_throughput(throughput: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for source, style in (
        ("api", "-o"),
        ("floor", "--s"),
        ("floor_no_rollup", ":^"),
        ("floor_delta_log", "-.v"),
    ):
        for mode, rows in throughput.get(source, {}).items():
            ax.plot(
                [r["clients"] for r in rows],
                [r["creates_per_s"] for r in rows],
                style,
                label=f"{source.replace('_', ' ')}, {mode}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 4, 16], ["1", "4", "16"])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("creates (+ releases) per second")
    ax.set_title("reservations/create + release")
    ax.legend(fontsize=7)
    _save(fig, path)
