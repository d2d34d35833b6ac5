"""The bench's instruction counter: each marked interval gets its own count, and a stray dump is refused.

`bench.instructions` runs a child under valgrind's callgrind, which dumps its
count at every `getppid`. The counts must land on the intervals the child
named, in order, and be repeatable: the same work counted twice reads the
same, and twice the work reads about twice as much.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.instructions import callgrind_parts, dumps_keep, intervals_label, parts_read
from tests.support.valgrind import valgrind_or_skip

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, os, sys
sys.path.insert(0, {root!r})
from bench.instructions import mark

def work(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

labels = []
mark(labels, "small"); work(20_000)
mark(labels, "large"); work(40_000)
mark(labels, "small"); work(20_000)
{stray}
mark(labels, "end")
with open({labels_path!r}, "w") as out:
    json.dump(labels, out)
"""


def _run(tmp_path: Path, *, stray: str = "", keep: Any = None) -> tuple[dict[int, int], list[str]]:
    labels_path = tmp_path / "labels.json"
    script = _CHILD.format(root=str(ROOT), stray=stray, labels_path=str(labels_path))
    parts = callgrind_parts([sys.executable, "-c", script], valgrind=valgrind_or_skip(), keep=keep)
    return parts, json.loads(labels_path.read_text())


def test_each_interval_is_counted_apart_and_repeatably(tmp_path: Path) -> None:
    parts, labels = _run(tmp_path)
    counted = intervals_label(parts, labels)
    assert labels == ["small", "large", "small", "end"]
    (first, second), (large,) = counted["small"], counted["large"]
    # The same work reads the same count (a few instructions of the marks aside) ...
    assert abs(first - second) < 0.01 * first
    # ... and twice the work about twice as much.
    assert 1.8 * first < large < 2.2 * first


def test_a_dump_no_mark_asked_for_is_refused(tmp_path: Path) -> None:
    parts, labels = _run(tmp_path, stray="os.getppid()")
    with pytest.raises(RuntimeError, match="something else called getppid"):
        intervals_label(parts, labels)


def test_parts_map_to_the_marks_in_order() -> None:
    # Part 1 is everything before the first mark; part k + 1 is what follows mark k.
    counted = intervals_label({1: 100, 2: 7, 3: 9, 4: 8, 5: 1}, ["a", "b", "a", "end"])
    assert counted == {"a": [7, 8], "b": [9], "end": [1]}
    with pytest.raises(RuntimeError):
        intervals_label({1: 100, 2: 7}, ["a", "end"])


def test_the_kept_profiles_are_the_counted_intervals_named_by_label(tmp_path: Path) -> None:
    kept: list[Path] = []
    labels_path = tmp_path / "labels.json"

    def keep(directory: Path) -> None:
        labels = json.loads(labels_path.read_text())
        kept.extend(dumps_keep(directory, labels, tmp_path / "kept", wanted=("small", "large")))

    parts, labels = _run(tmp_path, keep=keep)
    counted = intervals_label(parts, labels)
    assert [path.name for path in kept] == [
        "small-1.callgrind.out",
        "large-1.callgrind.out",
        "small-2.callgrind.out",
    ]
    # Each kept file is that interval's own dump: its total is the count the interval was given.
    totals = {path.name: next(iter(parts_read(path.parent, path.name).values())) for path in kept}
    assert totals == {
        "small-1.callgrind.out": counted["small"][0],
        "large-1.callgrind.out": counted["large"][0],
        "small-2.callgrind.out": counted["small"][1],
    }


def test_a_statements_label_is_kept_under_a_name_any_file_system_takes(tmp_path: Path) -> None:
    # By statement, a label holds the statement's first words: spaces, parentheses, a `/`, a `*`.
    label = "create 03 WITH c AS (SELECT * FROM a/b)"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for part, count in ((1, 50), (2, 700), (3, 5)):
        name = "callgrind.out" + (f".{part - 1}" if part > 1 else "")
        (dumps / name).write_bytes(b"version: 1\npart: %d\nsummary: %d\n" % (part, count))
    kept = dumps_keep(dumps, [label, "end"], tmp_path / "kept", wanted=(label,))
    assert [path.name for path in kept] == ["create_03_WITH_c_AS__SELECT___FROM_a_b_-1.callgrind.out"]
    assert parts_read(kept[0].parent, kept[0].name) == {2: 700}
