"""Lists of numbers written as ranges, the way Linux writes a cpuset: `0-15,32-47`."""

from __future__ import annotations

from collections.abc import Iterable


def ranges_text(values: Iterable[int]) -> str:
    """The numbers, sorted and deduplicated, with each run of consecutive ones as `first-last`.

    `[3, 0, 1, 2, 8, 10, 11]` is `0-3,8,10-11`; nothing is the empty string. It is
    the syntax of `cpuset.cpus`, so an operator can compare it with the node's files.
    """
    parts: list[str] = []
    run: list[int] = []
    for value in sorted(set(values)):
        if run and value == run[-1] + 1:
            run.append(value)
            continue
        if run:
            parts.append(_run_text(run))
        run = [value]
    if run:
        parts.append(_run_text(run))
    return ",".join(parts)


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
