"""What one create and one release cost in instructions: a count that does not change with the machine.

The profile's CPU figures (`bench.profile`, `time.process_time`) are what the
targets compare, but they move with the machine: the same commit read 3.1 ms
per create on one machine of this project and twice that on another. The
number of instructions the process runs for a request does not: valgrind's
callgrind counts them (user space, the process's own), the same on any
machine for the same Python, packages and data, and within a few per cent
from run to run on a fleet that each run adds bookings to. So
two commits can be compared on any machine, and a page's CPU figure can be
read against the machine's speed (instructions per microsecond of CPU).

`python -m bench.instructions --nodes N --reuse-db` counts on the kept fleet
(`python -m bench.profile --nodes N --keep-db` builds it); `python -m bench`
counts on its large fleet when valgrind is installed.

How: this process starts a child under callgrind with `--dump-before=getppid`,
so every `os.getppid()` the child calls writes the instructions counted since
the one before. The child sends each create and release through Django's
test client, as `bench.profile` does, with a mark right before and right after
each request; it writes down what each interval was. Nothing else in the
child calls `getppid` (the parent checks that the number of dumps matches).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from bench.clock import Clock, console

SAMPLES = 20
WARMUP = 10
# The intervals the child names; only the requests' are kept.
REQUESTS = ("create", "release")
_SUMMARY = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)
_PART = re.compile(rb"^part: (\d+)", re.MULTILINE)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def mark(labels: list[str], label: str) -> None:
    """Start the interval `label`: callgrind dumps what it counted since the last mark."""
    labels.append(label)
    os.getppid()


def _dumps_read(directory: Path, stem: str) -> dict[int, tuple[Path, int]]:
    """{part number: (path, instructions)} of every dump callgrind wrote as `stem`, `stem.1`, ..."""
    dumps: dict[int, tuple[Path, int]] = {}
    for path in directory.glob(f"{stem}*"):
        dump = path.read_bytes()
        part, summary = _PART.search(dump), _SUMMARY.search(dump)
        if part is None or summary is None:
            raise RuntimeError(f"{path.name} is not a callgrind dump")
        dumps[int(part.group(1))] = (path, int(summary.group(1)))
    return dumps


def parts_read(directory: Path, stem: str) -> dict[int, int]:
    """{part number: instructions} of every dump callgrind wrote as `stem`, `stem.1`, `stem.2`, ..."""
    return {part: count for part, (_, count) in _dumps_read(directory, stem).items()}


def intervals_label(
    parts: dict[int, int], labels: list[str], *, trigger: str = "getppid"
) -> dict[str, list[int]]:
    """Each labelled interval's instructions: part 1 is before the first mark, part k + 1 after mark k."""
    if sorted(parts) != list(range(1, len(labels) + 2)):
        raise RuntimeError(
            f"{len(parts)} callgrind dumps for {len(labels)} marks: something else called {trigger}"
        )
    counted: dict[str, list[int]] = {}
    for index, label in enumerate(labels, start=2):
        counted.setdefault(label, []).append(parts[index])
    return counted


def dumps_keep(
    directory: Path, labels: list[str], keep: Path, *, wanted: tuple[str, ...], stem: str = "callgrind.out"
) -> list[Path]:
    """Copy the dumps of the `wanted` intervals to `keep`, named `<label>-<n>.callgrind.out`.

    Each is one request's (or statement's) profile, function by function, for
    `callgrind_annotate` (or KCachegrind): where its instructions went, not just
    how many there were. A label's characters other than letters, digits, `.`,
    `_` and `-` become `_` in the name (a statement's label holds its first words).
    """
    dumps = _dumps_read(directory, stem)
    keep.mkdir(parents=True, exist_ok=True)
    kept: list[Path] = []
    seen: dict[str, int] = {}
    for index, label in enumerate(labels, start=2):
        if label not in wanted:
            continue
        seen[label] = seen.get(label, 0) + 1
        target = keep / f"{_UNSAFE.sub('_', label)}-{seen[label]}.callgrind.out"
        shutil.copyfile(dumps[index][0], target)
        kept.append(target)
    return kept


def summary(values: list[int]) -> dict[str, Any]:
    return {
        "p50": int(statistics.median(values)),
        "min": min(values),
        "max": max(values),
        "samples": len(values),
    }


def valgrind_path() -> str | None:
    return shutil.which("valgrind")


def callgrind_parts(
    argv: list[str], *, valgrind: str, keep: Callable[[Path], object] | None = None
) -> dict[int, int]:
    """Run `argv` under callgrind, dumping at every `getppid`: {part number: instructions}.

    Python's string hashing is fixed (`PYTHONHASHSEED=0`), so that dicts and
    sets are laid out, and so walked, the same from run to run. `keep` is
    handed the folder of the dumps before it is removed.
    """
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        command = [
            valgrind,
            "--tool=callgrind",
            "--dump-before=getppid",
            "--collect-jumps=no",
            f"--callgrind-out-file={Path(tmp) / 'callgrind.out'}",
            *argv,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        child = subprocess.run(command, env=env, capture_output=True, text=True)  # noqa: S603 - our own argv
        if child.returncode != 0:
            raise RuntimeError(
                f"under callgrind, {argv} failed:\n{child.stdout[-2000:]}{child.stderr[-4000:]}"
            )
        parts = parts_read(Path(tmp), "callgrind.out")
        if keep is not None:
            keep(Path(tmp))
        return parts


def instructions_measure(
    *,
    clock: Clock,
    samples: int = SAMPLES,
    warmup: int = WARMUP,
    nodes: int = 0,
    keep: Path | None = None,
) -> dict[str, Any] | None:
    """Count a create's and a release's instructions in a child under callgrind; None without valgrind.

    With `keep`, each counted request's profile is copied there (`dumps_keep`).
    """
    valgrind = valgrind_path()
    if valgrind is None:
        console.print("  valgrind not found: instructions not counted")
        return None
    version = subprocess.run([valgrind, "--version"], capture_output=True, text=True).stdout.strip()  # noqa: S603
    with tempfile.TemporaryDirectory(prefix="bench-labels-") as tmp:
        labels_path = Path(tmp) / "labels.json"
        argv = [sys.executable, "-m", "bench.instructions", "--child", "--labels", str(labels_path)]
        argv += ["--samples", str(samples), "--warmup", str(warmup)]
        step = f"{nodes:,} nodes: instructions of create + release x{samples} (callgrind)"
        kept: list[Path] = []

        def keep_dumps(directory: Path) -> None:
            assert keep is not None
            labels = json.loads(labels_path.read_text())
            kept.extend(dumps_keep(directory, labels, keep, wanted=REQUESTS))

        with clock.step(step), console.status("the child runs under callgrind (some fifty times slower)"):
            parts = callgrind_parts(argv, valgrind=valgrind, keep=keep_dumps if keep is not None else None)
        counted = intervals_label(parts, json.loads(labels_path.read_text()))
    if kept:
        console.print(
            f"  {len(kept)} requests' profiles kept in {keep}; by function, callers included:"
            f" callgrind_annotate --inclusive=yes --tree=caller {kept[0]}"
        )
    result: dict[str, Any] = {op: summary(counted[op]) for op in REQUESTS}
    result["valgrind"] = version
    result["python"] = sys.version.split()[0]
    return result


def instructions_line(counted: dict[str, Any], profile: dict[str, Any] | None = None) -> str:
    """One line for the terminal and the page: millions of instructions, and this machine's rate."""
    parts = []
    for op in REQUESTS:
        row = counted[op]
        spread = f"{row['min'] / 1e6:.2f} to {row['max'] / 1e6:.2f}"
        cpu = (profile or {}).get(op, {}).get("cpu_p50_ms")
        if cpu:
            spread += f"; {row['p50'] / (cpu * 1000):,.0f} per µs of this machine's CPU"
        parts.append(f"{op} {row['p50'] / 1e6:.2f} M ({spread})")
    return (
        f"Instructions per request (callgrind, median of {counted['create']['samples']}; "
        f"the same on any machine with Python {counted['python']} and these packages): " + "; ".join(parts)
    )


def pairs_marked(
    *,
    samples: int,
    warmup: int,
    key: str,
    mark_at: Callable[[str], object],
    sending: Callable[[str | None], AbstractContextManager[object]] | None = None,
) -> None:
    """The counted run of both counters: `warmup` pairs unmarked, then `samples` pairs, marked.

    `mark_at(label)` runs right before each marked request (its method) and right
    after it ("between"), and once at the end ("end"); each create and release goes
    through the test client, as `bench.profile` sends them, within
    `sending(method)` (`None` for an unmarked one) when given.
    """
    from bench.load import one_gpu_hour
    from bench.profile import _host, main_pool_ready

    with main_pool_ready(nodes=0, reuse_db=True, keep_db=True, clock=Clock()) as (token, tenant, pool_id):
        from django.test import Client
        from django.test.utils import override_settings

        client = Client(SERVER_NAME=_host(), HTTP_AUTHORIZATION=f"Bearer {token}")
        stamp = f"{time.time_ns():x}"

        def request(method: str, body: dict[str, Any], expect: int, marked: bool) -> dict[str, Any]:
            if marked:
                mark_at(method)
            with sending(method if marked else None) if sending else nullcontext():
                response = client.post(
                    f"/api/compute/reservations/{method}", json.dumps(body), "application/json"
                )
            if marked:
                mark_at("between")
            if response.status_code != expect:
                raise RuntimeError(
                    f"reservations/{method} answered {response.status_code}: {response.content!r}"
                )
            answer: dict[str, Any] = json.loads(response.content)
            return answer

        def pair(index: int, marked: bool) -> None:
            body = one_gpu_hour(tenant_id=tenant, pool_id=pool_id, key=f"{key}-{stamp}-{index}")
            created = request("create", body, 201, marked)
            request("release", {"tenantId": tenant, "reservationId": created["id"]}, 200, marked)

        # As in bench.profile: the bench's own writes are not to be refused by the rate limits. A
        # request takes some fifty times longer under callgrind, so the token, remembered for a
        # second, would be read again every other request instead of once in a few hundred: it is
        # remembered for the run.
        with override_settings(
            API_WRITES_PER_MINUTE_PER_TOKEN=10**9,
            API_WRITES_PER_MINUTE_PER_TENANT=10**9,
            AUTH_CACHE_SECONDS=3600,
        ):
            for index in range(warmup):
                pair(index, marked=False)
            for index in range(warmup, warmup + samples):
                pair(index, marked=True)
        mark_at("end")


def _child(labels_path: Path, samples: int, warmup: int) -> None:
    """Under callgrind: `warmup` pairs unmarked, then `samples` pairs with a mark around each request."""
    labels: list[str] = []
    pairs_marked(samples=samples, warmup=warmup, key="cg", mark_at=lambda label: mark(labels, label))
    labels_path.write_text(json.dumps(labels))


def count_arguments(parser: argparse.ArgumentParser, *, warmup: int) -> None:
    """`--samples`, `--warmup`, `--keep-dumps` and the child's own: what both counters take."""
    parser.add_argument("--samples", type=int, default=SAMPLES, help="creates + releases counted")
    parser.add_argument("--warmup", type=int, default=warmup, help="pairs run first, not counted")
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        metavar="DIR",
        help="copy each counted request's callgrind profile to DIR (create-1.callgrind.out, ...)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--labels", type=Path, help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.instructions --nodes N`: count on a fleet of its own (or the kept one)."""
    from bench.profile import fleet_arguments, main_pool_ready

    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    fleet_arguments(parser)
    count_arguments(parser, warmup=WARMUP)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.labels, args.samples, args.warmup)
        return
    clock = Clock()
    with main_pool_ready(nodes=args.nodes, reuse_db=args.reuse_db, keep_db=args.keep_db, clock=clock):
        counted = instructions_measure(
            clock=clock, samples=args.samples, warmup=args.warmup, nodes=args.nodes, keep=args.keep_dumps
        )
    if counted is not None:
        console.print(instructions_line(counted))


if __name__ == "__main__":
    main()
