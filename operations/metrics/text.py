"""The Prometheus text format, written directly for the families read from the database.

A scrape at fleet scale carries thousands of capacity samples; building a
prometheus_client sample object per value costs more than the query that
read them, so these families are formatted straight into lines.
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


def number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    return repr(float(value))


@dataclass
class Family:
    """One metric family: its header and its samples, each a label set and a value."""

    name: str
    kind: str  # gauge, or counter (whose name then ends in `_total`, as the format wants)
    help: str
    labels: Sequence[str] = ()
    samples: list[tuple[Sequence[object], float | int]] = field(default_factory=list)

    def add(self, values: Sequence[object], value: float | int) -> None:
        self.samples.append((values, value))

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        sample = self.name
        names = self.labels
        for values, value in self.samples:
            if names:
                pairs = ",".join(f'{n}="{label_value(v)}"' for n, v in zip(names, values, strict=True))
                yield f"{sample}{{{pairs}}} {number(value)}"
            else:
                yield f"{sample} {number(value)}"


def render(families: Iterable[Family]) -> str:
    return "\n".join(line for family in families for line in family.lines()) + "\n"
