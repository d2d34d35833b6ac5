"""The management commands' progress bar on a terminal (`rebuild_rollups`, `load_fleet`)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(label: str, *, console: Console | None = None) -> Progress:
    """`label`, the bar, done/total and the time elapsed; gone from the terminal once it ends.

    Use it as a context manager. `console` is rich's (stdout) unless given.
    """
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
