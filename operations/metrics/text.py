"""The Prometheus text format, written directly for the families read from the database.

A scrape at fleet scale carries thousands of capacity samples; building a
prometheus_client sample object per value costs more than the query that
read them, so these families are formatted straight into lines. A sample's
labels are rendered when it is added, and samples that share all labels but
the last (a pool's rollup row, one sample per column) render the shared ones
once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def label_value(value: object) -> str:
    """A label value as the exposition format quotes it (backslash, quote and newline escaped)."""
    text = "" if value is None else str(value)
    if "\\" in text or '"' in text or "\n" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return text


def label_pairs(names: Sequence[str], values: Sequence[object]) -> str:
    """`name="value",...`, the text between a sample's braces."""
    return ",".join(f'{n}="{label_value(v)}"' for n, v in zip(names, values, strict=True))


def number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    return repr(float(value))


@dataclass
class Family:
    """One metric family: its header and its samples, each its rendered labels and a value."""

    name: str
    kind: str  # gauge, or counter (whose name then ends in `_total`, as the format wants)
    help: str
    labels: Sequence[str] = ()
    samples: list[tuple[str, float | int]] = field(default_factory=list)

    def add(self, values: Sequence[object], value: float | int) -> None:
        self.samples.append((label_pairs(self.labels, values), value))

    def add_each(self, values: Sequence[object], last: Iterable[tuple[object, float | int]]) -> None:
        """One sample per (last label's value, value), every other label `values`, rendered once."""
        *shared, name = self.labels
        head = f"{label_pairs(shared, values)},{name}=" if shared else f"{name}="
        self.samples.extend((f'{head}"{label_value(tail)}"', value) for tail, value in last)

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        sample = self.name
        for pairs, value in self.samples:
            yield f"{sample}{{{pairs}}} {number(value)}" if pairs else f"{sample} {number(value)}"


def render(families: Iterable[Family]) -> str:
    return "\n".join(line for family in families for line in family.lines()) + "\n"
