"""Write the benchmark's results: JSON, PNG charts (matplotlib, Agg) and `docs/benchmarks.md`.

The page is generated from the run, so every number on it is one the run
measured; `docs/scaling.md` cites them by hand.
"""

# Markdown table rows and their cells read best on one line each; the page uses the times and
# less-or-equal signs.
# ruff: noqa: E501, RUF001

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# The targets of the 10,000-node run (2-core machine, one million bookings).
READ_P50_MS = 10.0
READ_GROWTH = 1.2
PREVIEW_8_P50_MS = 50.0
THROUGHPUT_SHARE_OF_FLOOR = 0.5
REBUILD_S = 5.0
USAGE_MS = 100.0
TIMELINE_MS = 100.0
RSS_MB = 250.0
# Issue 14's write-path targets.
CREATE_P50_MS = 10.0
CREATE_GROWTH = 1.3
PREVIEW_SELECTOR_P50_MS = 50.0
PREVIEW_SELECTOR_GROWTH = 1.5
LOST_RACES_SHARE = 0.02
# Issue 15's planning answers.
EARLIEST_P50_MS = 200.0


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


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


def _chart_reads(results: dict[str, Any], path: Path) -> None:
    _chart_latencies(
        path,
        {size: run["reads"] for size, run in results["sizes"].items()},
        ["summary", "byPool", "timeline"],
        title="Capacity reads over HTTP",
        target_ms=READ_P50_MS,
        figsize=(7, 3.6),
        dash=300,
    )


def _chart_preview(results: dict[str, Any], path: Path) -> None:
    by_size = {size: run["reads"]["preview"] for size, run in results["sizes"].items()}
    _chart_latencies(
        path,
        by_size,
        list(next(iter(by_size.values()))),
        title="capacity/preview over HTTP",
        target_ms=PREVIEW_8_P50_MS,
        figsize=(8, 3.8),
        dash=200,
        rotation=20,
        fontsize=8,
    )


def _chart_earliest(results: dict[str, Any], path: Path) -> None:
    by_size = {size: run["reads"]["earliest"] for size, run in results["sizes"].items()}
    _chart_latencies(
        path,
        by_size,
        list(next(iter(by_size.values()))),
        title="capacity/earliest over HTTP (7-day horizon)",
        target_ms=EARLIEST_P50_MS,
        figsize=(8, 3.8),
        dash=200,
        rotation=10,
        fontsize=8,
    )


def _chart_throughput(throughput: dict[str, Any], path: Path) -> None:
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


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    sizes = sorted(results["sizes"], key=int)
    small, big = results["sizes"][sizes[0]], results["sizes"][sizes[-1]]
    rows: list[tuple[str, str, str]] = []
    for name in ("summary", "byPool"):
        p50 = big["reads"][name]["p50_ms"]
        ratio = p50 / small["reads"][name]["p50_ms"]
        rows.append(
            (
                f"`capacity/{name}`{' (with fragmentation)' if name == 'byPool' else ''} p50 < {READ_P50_MS:.0f} ms"
                f" and ≤ {READ_GROWTH}× the {int(sizes[0]):,}-node figure",
                f"{p50:.2f} ms, ratio {ratio:.2f}",
                _verdict(p50 < READ_P50_MS and ratio <= READ_GROWTH),
            )
        )
    p8 = big["reads"]["preview"]["8 GPUs"]["p50_ms"]
    rows.append(
        (
            f"`capacity/preview` 8 GPUs p50 < {PREVIEW_8_P50_MS:.0f} ms",
            f"{p8:.1f} ms",
            _verdict(p8 < PREVIEW_8_P50_MS),
        )
    )
    if all("create_one_client" in results["sizes"][s] for s in sizes):
        p50s = [results["sizes"][s]["create_one_client"]["create_p50_ms"] for s in sizes]
        growth = [b / a for a, b in itertools.pairwise(p50s)]
        rows.append(
            (
                f"create p50 at 1 client < {CREATE_P50_MS:.0f} ms and each size ≤ {CREATE_GROWTH}× the one before",
                f"{p50s[-1]:.1f} ms; "
                + ", ".join(
                    f"{int(b):,}/{int(a):,}: {g:.2f}"
                    for (a, b), g in zip(itertools.pairwise(sizes), growth, strict=True)
                ),
                _verdict(p50s[-1] < CREATE_P50_MS and all(g <= CREATE_GROWTH for g in growth)),
            )
        )
    for shape in ("1 GPU + selector", "8 GPUs + selector"):
        p50 = big["reads"]["preview"][shape]["p50_ms"]
        ratio = p50 / small["reads"]["preview"][shape]["p50_ms"]
        rows.append(
            (
                f"`capacity/preview` {shape} p50 ≤ {PREVIEW_SELECTOR_P50_MS:.0f} ms"
                f" and ≤ {PREVIEW_SELECTOR_GROWTH}× the {int(sizes[0]):,}-node figure",
                f"{p50:.1f} ms, ratio {ratio:.2f}",
                _verdict(p50 <= PREVIEW_SELECTOR_P50_MS and ratio <= PREVIEW_SELECTOR_GROWTH),
            )
        )
    throughput = big.get("throughput")
    if throughput:
        last = throughput["api"]["one pool"][-1]
        share = last["lost_races"] / last["creates"] if last["creates"] else 0.0
        rows.append(
            (
                f"lost races at {last['clients']} clients (one pool) ≤ {LOST_RACES_SHARE:.0%} of creates",
                f"{last['lost_races']} of {last['creates']} = {share:.1%}"
                f" (and {last.get('passed_over', 0)} options passed over at the claim)",
                _verdict(share <= LOST_RACES_SHARE),
            )
        )
        for mode in throughput["api"]:
            api16 = throughput["api"][mode][-1]["creates_per_s"]
            floor16 = throughput["floor"][mode][-1]["creates_per_s"]
            share = api16 / floor16 if floor16 else 0.0
            rows.append(
                (
                    f"create at 16 clients ({mode}) ≥ {THROUGHPUT_SHARE_OF_FLOOR:.0%} of the SQL floor",
                    f"{api16:.1f}/s vs {floor16:.1f}/s = {share:.0%}",
                    _verdict(share >= THROUGHPUT_SHARE_OF_FLOOR),
                )
            )
    for shape, result in big["reads"].get("earliest", {}).items():
        found = f"starts in {result['wait_h']} h" if result.get("fits") else "none in 7 days"
        rows.append(
            (
                f"`capacity/earliest` {shape}, 7-day horizon, p50 ≤ {EARLIEST_P50_MS:.0f} ms",
                f"p50 {result['p50_ms']:.1f} ms ({found}, {result.get('tried')} instant(s) tried)",
                _verdict(result["p50_ms"] <= EARLIEST_P50_MS),
            )
        )
    rebuild = big["rebuild"]["median_s"]
    rows.append(
        (
            f"`rebuild_rollups` whole fleet < {REBUILD_S:.0f} s",
            f"{rebuild:.2f} s",
            _verdict(rebuild < REBUILD_S),
        )
    )
    timeline = big["reads"]["timeline"]["p50_ms"]
    rows.append(
        (
            f"`capacity/timeline` 7 days / 336 buckets < {TIMELINE_MS:.0f} ms",
            f"p50 {timeline:.1f} ms",
            _verdict(timeline < TIMELINE_MS),
        )
    )
    usage = big["reads"].get("usage/hourly")
    if usage is not None:
        rows.append(
            (
                f"`usage/hourly` one tenant, 31 days p50 ≤ {USAGE_MS:.0f} ms",
                f"p50 {usage['p50_ms']:.1f} ms ({usage.get('rows')} rows)",
                _verdict(usage["p50_ms"] <= USAGE_MS),
            )
        )
    rss = max(big["peak_rss_mb"].values()) if big["peak_rss_mb"] else 0.0
    rows.append((f"server memory < {RSS_MB:.0f} MB per worker", f"peak {rss:.0f} MB", _verdict(rss < RSS_MB)))
    return rows


def _latency_table_head(title: str, chart: str, column: str, sizes: list[str]) -> list[str]:
    """A section's title, its chart, and the head of its table: p50 and p99 per fleet size."""
    return [
        f"## {title}",
        "",
        f"![{chart}](benchmarks/{chart}.png)",
        "",
        f"| {column} | " + " | ".join(f"{int(s):,} p50 ms | {int(s):,} p99 ms" for s in sizes) + " |",
        "| --- | " + " | ".join("---: | ---:" for _ in sizes) + " |",
    ]


def _latency_cells(latencies: list[dict[str, Any]], *, digits: int) -> str:
    return " | ".join(f"{x['p50_ms']:.{digits}f} | {x['p99_ms']:.{digits}f}" for x in latencies)


def _markdown(results: dict[str, Any]) -> str:
    sizes = sorted(results["sizes"], key=int)
    big = results["sizes"][sizes[-1]]
    machine = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench`); do not edit by hand. The raw numbers are in",
        "[`benchmarks/results.json`](benchmarks/results.json). How the service scales beyond one machine,",
        "and which of these numbers say when, is in [scaling.md](scaling.md).",
        "",
        f"Machine: {machine['cpus']} CPUs, Python {machine['python']}, {machine['platform']}; PostgreSQL on the",
        "same machine; gunicorn with 2 sync workers, `DEBUG` off. Load average during the run:"
        f" {', '.join(f'{x:.1f}' for x in machine.get('loadavg_start', []))} at the start,"
        f" {', '.join(f'{x:.1f}' for x in machine.get('loadavg_end', []))} at the end"
        " (the machine is shared, so absolute latencies carry that noise; ratios less so).",
        f"The whole run took {results['total_s']:.0f} s.",
        "",
        "## Targets (10,000 nodes, one million bookings)" if sizes[-1] == "10000" else "## Targets",
        "",
        "| target | measured | |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _targets(results)]
    lines += [
        "",
        "## Fleets",
        "",
        "| nodes | pools | GPU-class atoms | bookings | booked now | start later | rebuild median |",
    ]
    lines += ["| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size in sizes:
        s = results["sizes"][size]
        f = s["fill"]
        lines.append(
            f"| {int(size):,} | {s['pools']} | {f['atoms']:,} | {f['bookings']:,} | {f['booked_now']:,}"
            f" | {f['booked_later']:,} | {s['rebuild']['median_s']:.2f} s |"
        )
    lines += [
        "",
        "Bookings: every GPU-class atom (`gpu`, `gpu.mig`, `gpu.slot`) in groups of four per node, each group",
        "booked in evenly spaced windows from 30 days ago to 7 days ahead, half of each period booked, with a",
        "phase per group. So about half of the atoms are busy now and most rows are history.",
        "",
    ]
    for size in sizes:
        closed = results["sizes"][size].get("usage_close")
        if closed:
            lines.append(
                f"* {int(size):,} nodes: the worker's `usage-close` closed the month's {closed['hours']:,} hours"
                f" into {closed['rows']:,} usage rows in {closed['seconds']:.1f} s."
            )
    lines += [
        "",
        *_latency_table_head("Reads over HTTP", "reads", "method", sizes),
    ]
    for name in ("no credential (401)", "summary", "byPool", "timeline"):
        if name not in results["sizes"][sizes[0]]["reads"]:
            continue
        cells = _latency_cells([results["sizes"][s]["reads"][name] for s in sizes], digits=2)
        lines.append(f"| {name if ' ' in name else f'`capacity/{name}`'} | {cells} |")
    for name in ("usage/hourly", "usage/hourly open hour"):
        if all(name in results["sizes"][s]["reads"] for s in sizes):
            cells = _latency_cells([results["sizes"][s]["reads"][name] for s in sizes], digits=2)
            lines.append(f"| `{name}` | {cells} |")
    if len(sizes) > 1:
        lines.append("")
        for name in ("summary", "byPool"):
            ratio = (
                results["sizes"][sizes[-1]]["reads"][name]["p50_ms"]
                / results["sizes"][sizes[0]]["reads"][name]["p50_ms"]
            )
            lines.append(
                f"* `{name}` p50 at {int(sizes[-1]):,} nodes / at {int(sizes[0]):,} nodes: **{ratio:.2f}**"
            )
    lines += [
        "",
        "The timeline asks 7 days in 30-minute steps (336 buckets) of the H100 pool, starting 3 days ago.",
        "`usage/hourly` asks the H100 pool's owner for the 31 days that end with the last closed hour (one",
        "page of up to 1,000 rows, read from the usage table the bench filled by running the worker's",
        "`usage-close` over the month); *open hour* asks for the current hour, computed from the bookings.",
        "*no credential (401)* is `capacity/summary` with an empty bearer token: refused before any query,",
        "it is what HTTP, gunicorn, Django and DRF cost per call on this machine, under every other line.",
        "",
        *_latency_table_head("capacity/preview", "preview", "request", sizes),
    ]
    for shape in results["sizes"][sizes[0]]["reads"]["preview"]:
        cells = _latency_cells([results["sizes"][s]["reads"]["preview"][shape] for s in sizes], digits=1)
        lines.append(f"| {shape} | {cells} |")
    lines += [
        "",
        'The selector is `{"vramGiB": {"gte": 80}, "gpuModel": "H100"}`; every request is for one hour.',
        "",
    ]
    if all("earliest" in results["sizes"][s]["reads"] for s in sizes):
        lines += [*_latency_table_head("capacity/earliest", "earliest", "request", sizes)]
        for shape in results["sizes"][sizes[0]]["reads"]["earliest"]:
            cells = _latency_cells([results["sizes"][s]["reads"]["earliest"][shape] for s in sizes], digits=1)
            lines.append(f"| {shape} | {cells} |")
        lines += [
            "",
            "Each asks the H100 pool for the earliest start within 7 days. Where it starts, and how many",
            "instants the placer was asked at, at each size: "
            + "; ".join(
                f"{int(s):,} nodes: "
                + ", ".join(
                    f"{shape} "
                    + (f"in {r['wait_h']} h" if r.get("fits") else "none")
                    + f" ({r.get('tried')} tried)"
                    for shape, r in results["sizes"][s]["reads"]["earliest"].items()
                )
                for s in sizes
            )
            + ".",
            "",
        ]
    throughput = big.get("throughput")
    if throughput:
        lines += [
            "## reservations/create + release",
            "",
            "![throughput](benchmarks/throughput.png)",
            "",
            "Each client loops: create (1 GPU, 1 hour) then release, through HTTP. *One pool*: every client books",
            "in the same H100 pool; *spread*: client *i* books in exclusive pool *i* mod 9. The floor runs the same",
            "guarded statements of one placement and one release as plain psycopg transactions (no planning,",
            "no Django, no HTTP), each client on its own atoms.",
            "",
            "| source | mode | clients | creates/s | create p50 ms | create p99 ms | lost races | passed over"
            " | replans | NO_CAPACITY |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for source in ("api", "floor", "floor_no_rollup", "floor_delta_log"):
            for mode, rows in throughput.get(source, {}).items():
                for r in rows:
                    lines.append(
                        f"| {source.replace('_', ' ')} | {mode} | {r['clients']} | {r['creates_per_s']:.1f}"
                        f" | {_fmt(r.get('create_p50_ms'))} | {_fmt(r.get('create_p99_ms'))}"
                        f" | {r.get('lost_races', r.get('lost', '-'))} | {r.get('passed_over', '-')}"
                        f" | {r.get('replans', '-')} | {r.get('no_capacity', '-')} |"
                    )
        lines += [
            "",
            "A *lost race* is an option whose booking was written and rolled back because a concurrent",
            "placement got its atoms first (the placement then waited for that one's commit). An option",
            "*passed over* was seen taken at the claim, before anything was written: a one-atom placement",
            "takes the first of its node's free atoms that no concurrent placement holds or has booked since",
            "the plan (`FOR NO KEY UPDATE SKIP LOCKED`), and moves to its next option when there is none.",
            "",
        ]
        for mode in throughput["api"]:
            for api_row, floor_row in zip(throughput["api"][mode], throughput["floor"][mode], strict=True):
                share = (
                    api_row["creates_per_s"] / floor_row["creates_per_s"] if floor_row["creates_per_s"] else 0
                )
                lines.append(f"* {mode}, {api_row['clients']} clients: API / floor = **{share:.0%}**")
        lines.append("")
        if "floor_no_rollup" in throughput:
            lines += [
                "*floor no rollup* is the floor without the rollup delta statement, and *floor delta log* the floor",
                "with the delta appended to a log table instead of updating the pool's row: the difference between",
                "them and the floor on one pool is what the single hot rollup row costs.",
                "",
            ]
    lines += _profile_lines(results, sizes)
    lines += _worker_lines(results, sizes)
    lines += ["## Server memory", ""]
    for size in sizes:
        rss = results["sizes"][size]["peak_rss_mb"]
        lines.append(
            f"* {int(size):,} nodes: peak RSS per worker " + ", ".join(f"{v:.0f} MB" for v in rss.values())
        )
    lines += ["", "## Steps", "", "| step | seconds |", "| --- | ---: |"]
    lines += [f"| {name} | {secs:.1f} |" for name, secs in results["steps_s"].items()]
    lines.append("")
    return "\n".join(lines)


def _profile_lines(results: dict[str, Any], sizes: list[str]) -> list[str]:
    """Where one create and one release spend their time, per stage, at each size (bench/profile.py)."""
    from bench.profile import FRAMEWORK, STAGES

    measured = [s for s in sizes if "profile" in results["sizes"][s]]
    if not measured:
        return []
    lines = [
        "## Where a create and a release spend their time",
        "",
        "One create (1 GPU, 1 hour, the main pool) then its release, in a row, through the real views in the",
        "bench's process (Django's test client: middleware, routing, DRF's authentication, parser and renderer;",
        "no socket, no gunicorn). Each stage is a product function timed where its caller looks it up, minus",
        "the stages nested in it; every SQL statement is timed and counted to the stage running it. *share* is",
        "the stage's mean over the request's mean; *framework (rest)* is what no stage accounts for.",
        "",
    ]
    for size in measured:
        profile = results["sizes"][size]["profile"]
        lines += [
            f"{int(size):,} nodes, p50 of {profile['samples']}:",
            "",
            "| stage | create share | create p50 ms | SQL ms | statements"
            " | release share | release p50 ms | SQL ms | statements |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for stage in (*STAGES, FRAMEWORK):
            cells = []
            for op in ("create", "release"):
                row = profile[op]["stages"][stage]
                if row["calls"] == 0 and stage != FRAMEWORK:
                    cells.append(" | | |")
                else:
                    cells.append(
                        f"{row['share']:.1%} | {row['p50_ms']:.2f} | {row['sql_p50_ms']:.2f} | {row['statements']:g}"
                    )
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        create, release = profile["create"], profile["release"]
        lines += [
            f"| **whole request** | 100% | {create['p50_ms']:.2f} | | {create['statements']:g}"
            f" | 100% | {release['p50_ms']:.2f} | | {release['statements']:g} |",
            "",
        ]
    return lines


def _worker_lines(results: dict[str, Any], sizes: list[str]) -> list[str]:
    """The worker's section: a pass of every job, its schedule query, its CPU per minute (bench/worker.py)."""
    size = next((s for s in reversed(sizes) if "worker" in results["sizes"][s]), None)
    if size is None:
        return []
    worker = results["sizes"][size]["worker"]
    first, steady = worker["first_pass"], worker["steady_pass"]
    lines = [
        f"## The worker ({int(size):,} nodes)",
        "",
        "One pass of every job, due or not (`WorkerLoop.run_once`): the first after the fleet was written,",
        "then a steady one. The loop runs a job only when it falls due; this is the cost of all of them at once.",
        "",
        "| job | first pass s | did | steady pass s | did |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, job in first["jobs"].items():
        again = steady["jobs"].get(name, {})
        failed = "" if job["ok"] else " (failed)"
        lines.append(
            f"| `{name}`{failed} | {job['seconds']:.3f} | {job['count']} | {again.get('seconds', 0):.3f} | {again.get('count', '')} |"
        )
    lines.append(f"| whole pass | {first['total_s']:.3f} | | {steady['total_s']:.3f} | |")
    schedule = worker["schedule"]
    lines += [
        "",
        f"The schedule query (`next_deadline()`, run on every wake): p50 {schedule['p50_ms']:.2f} ms, p99 {schedule['p99_ms']:.2f} ms.",
        "",
        "CPU per minute of `manage.py worker` (user + system) and of its two database backends:",
        "",
    ]
    labels = {
        "idle": "idle (the fleet loaded, nothing booked: nothing falls due)",
        "steady": "steady (one million bookings starting and ending)",
    }
    for key, label in labels.items():
        cpu = worker.get(f"cpu_{key}")
        if not cpu:
            continue
        db = f"{cpu['db_cpu_s_per_min']:.3f} s" if cpu["db_cpu_s_per_min"] is not None else "not readable"
        lines.append(
            f"* {label}: worker {cpu['worker_cpu_s_per_min']:.3f} s, database {db},"
            f" {cpu['passes_per_min']:.0f} passes per minute"
        )
    lines.append("")
    return lines


def report_write(*, results: dict[str, Any], out_dir: Path, page: Path) -> None:
    """Write `results.json`, the charts and the markdown page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    _chart_reads(results, out_dir / "reads.png")
    _chart_preview(results, out_dir / "preview.png")
    if all("earliest" in run["reads"] for run in results["sizes"].values()):
        _chart_earliest(results, out_dir / "earliest.png")
    sizes = sorted(results["sizes"], key=int)
    throughput = results["sizes"][sizes[-1]].get("throughput")
    if throughput:
        _chart_throughput(throughput, out_dir / "throughput.png")
    page.write_text(_markdown(results))
