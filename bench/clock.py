"""The bench's clock: prints each step's duration as it ends, and keeps them for the report."""

from __future__ import annotations

import os
import time

from rich.console import Console

console = Console()


class Clock:
    """Prints each step's duration, and keeps them for the report."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.steps: dict[str, float] = {}

    def step(self, name: str) -> _Step:
        return _Step(self, name)


class _Step:
    def __init__(self, clock: Clock, name: str) -> None:
        self.clock = clock
        self.name = name

    def __enter__(self) -> None:
        self.t0 = time.monotonic()
        console.print(f"[bold cyan]▶ {self.name}[/]")

    def __exit__(self, *exc: object) -> None:
        took = time.monotonic() - self.t0
        self.clock.steps[self.name] = round(took, 2)
        total = time.monotonic() - self.clock.started
        console.print(f"  [green]✓[/] {self.name}: {took:.1f}s (total {total:.0f}s)")


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a local process (`/proc/<pid>/stat`), or None when it cannot be read.

    Read from the kernel, so measuring a database backend sends it nothing;
    the kernel counts in clock ticks (10 ms at 100 Hz), so only a mean over
    many requests means anything.
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
