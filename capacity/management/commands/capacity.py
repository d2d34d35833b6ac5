"""`capacity --tenant T [--pool ID] [--preview --gpus N --for 1d --selector "..."] [--json]`.

The seeds' CLI: the tenant's summary, one pool's rows, or a placement
preview. `--json` prints exactly what the API answers.
"""

from __future__ import annotations

import io
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from capacity.preview_cli import preview_command
from capacity.selectors.pools import capacity_summary, pool_capacity
from core.models import Tenant
from inventory.schedulability import BUCKETS
from ledger.access import visible_pools
from reservations.models import ROLLUP_COUNTS

ROW_COLUMNS = ("resource", *ROLLUP_COUNTS)
BAR_WIDTH = 30


class Command(BaseCommand):
    help = "Show a tenant's capacity: the summary, one pool's rollup rows, or a placement preview."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant whose view to show.")
        parser.add_argument("--pool", help="One pool's rows (or the pool to preview in).")
        parser.add_argument("--json", action="store_true", help="Print the API's JSON answer.")
        # --preview and its arguments: `capacity.preview_cli.preview_command` builds
        # the API's request and prints the answer; this command only parses.
        parser.add_argument("--preview", action="store_true", help="Would a request fit now, and where?")
        parser.add_argument("--gpus", type=int, help="With --preview: how many GPUs.")
        parser.add_argument(
            "--for", dest="duration", help="With --preview: how long (1d, 8h, PT8H, seconds)."
        )
        parser.add_argument(
            "--selector", help='With --preview: clauses such as "vramGiB >= 80, gpuModel == H100".'
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id: str = options["tenant"]
        pool_id: str | None = options["pool"]
        as_json: bool = options["json"]
        if options["preview"]:
            self._preview(tenant_id, pool_id, options, as_json)
            return
        if any(options[name] is not None for name in ("gpus", "duration", "selector")):
            raise CommandError("--gpus, --for and --selector go with --preview")
        if pool_id:
            if not visible_pools(tenant_id=tenant_id).filter(pk=pool_id).exists():
                raise CommandError(f"pool {pool_id} not found for tenant {tenant_id}")
            answer: dict[str, Any] = pool_capacity(pool_id=pool_id)
            if as_json:
                self.stdout.write(json.dumps(answer, indent=2))
            else:
                self._print_pool(answer)
            return
        if not Tenant.objects.filter(pk=tenant_id).exists():
            raise CommandError(f"tenant {tenant_id} not found")
        summary = capacity_summary(tenant_id=tenant_id)
        if as_json:
            self.stdout.write(json.dumps(summary, indent=2))
        else:
            self._print_summary(summary)

    def _preview(self, tenant_id: str, pool_id: str | None, options: dict[str, Any], as_json: bool) -> None:
        if not pool_id or options["gpus"] is None or not options["duration"]:
            raise CommandError("--preview needs --pool, --gpus and --for")
        preview_command(
            tenant_id,
            pool_id,
            options["gpus"],
            options["duration"],
            options["selector"],
            as_json,
            self.stdout,
        )

    # Rendering ---------------------------------------------------------

    def _emit(self, *renderables: Any) -> None:
        """Render with rich into a buffer, then write once (OutputWrapper adds line endings per write)."""
        from rich.console import Console

        buffer = io.StringIO()
        tty = self.stdout.isatty()
        console = Console(file=buffer, force_terminal=tty, no_color=not tty, width=160)
        for renderable in renderables:
            console.print(renderable)
        self.stdout.write(buffer.getvalue(), ending="")

    def _rows_table(self, title: str, rows: list[dict[str, Any]]) -> Any:
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for column in ROW_COLUMNS:
            table.add_column(column, justify="left" if column == "resource" else "right")
        for row in rows:
            table.add_row(*(str(row[column]) for column in ROW_COLUMNS))
        return table

    def _print_pool(self, answer: dict[str, Any]) -> None:
        out: list[Any] = [self._rows_table(answer["poolId"], answer["rows"])]
        gpu = next((row for row in answer["rows"] if row["resource"] == "gpu"), None)
        if gpu is not None and self.stdout.isatty():
            out.append(_bar(gpu))
        at_risk = answer.get("atRiskReservations", 0)
        if at_risk:
            noun = "reservation is" if at_risk == 1 else "reservations are"
            out.append(f"[red]{at_risk} {noun} at risk in this pool (booked on nodes out of service)[/red]")
        self._emit(*out)

    def _print_summary(self, summary: dict[str, Any]) -> None:
        from rich.table import Table

        out: list[Any] = [f"Capacity for tenant [bold]{summary['tenantId']}[/bold]"]
        counts = ("total", "allocatable", "allocated", "reserved", "available")
        pools = Table(
            title="Pools (the pool's GPU atoms: whole GPUs, MIG instances or slots)", title_justify="left"
        )
        for column in ("pool", "id", "model", "unit", *counts, "not allocatable"):
            pools.add_column(column, justify="right" if column in counts else "left", no_wrap=column == "id")
        bars = self.stdout.isatty()
        if bars:
            pools.add_column("allocated / reserved / available")
        partitioned: dict[str, dict[str, int]] = {}
        for pool in summary["pools"]:
            resource, unit = GPU_UNIT_OF_SHARING.get(pool["sharing"], ("gpu", "GPUs"))
            row = next((r for r in pool["capacity"] if r["resource"] == resource), None)
            name = pool["name"]
            if pool["offered"]:
                name += f" (offered by {pool['ownerTenantId']})"
            if pool["archived"]:
                name += " (archived)"
            model = pool["gpuModel"] or "other"
            cells = [name, pool["poolId"], model, unit]
            cells += [str(row[k]) if row else "-" for k in counts]
            cells.append(", ".join(f"{row[b]} {b}" for b in BUCKETS if row and row[b]) or "-")
            if bars:
                cells.append(_bar(row) if row else "")
            pools.add_row(*cells)
            if row is not None and resource != "gpu":
                sums = partitioned.setdefault(f"{model} {unit}", dict.fromkeys(MODEL_COUNTS, 0))
                for k in MODEL_COUNTS:
                    sums[k] += row[k]
        out.append(pools)

        models = Table(
            title="By GPU model (whole GPUs, as the API's byGpuModel; partitioned pools in their own units)",
            title_justify="left",
        )
        for column in ("model", *MODEL_COUNTS):
            models.add_column(column, justify="left" if column == "model" else "right")
        for model, sums in summary["byGpuModel"].items():
            if model in {key.split(" ", 1)[0] for key in partitioned} and not sums["total"]:
                continue  # a model served only by partitioned pools: its row below says it in its units
            models.add_row(model, *(str(sums[k]) for k in MODEL_COUNTS))
        for label, sums in sorted(partitioned.items()):
            models.add_row(label, *(str(sums[k]) for k in MODEL_COUNTS))
        out.append(models)

        for pool in summary["pools"]:
            others = [row for row in pool["capacity"] if row["resource"] != "gpu"]
            if others:
                out.append(self._rows_table(f"{pool['name']}: other resources", others))
        self._emit(*out)


# What a pool of each sharing mode hands out, and what to call it.
GPU_UNIT_OF_SHARING = {
    "exclusive": ("gpu", "GPUs"),
    "mig": ("gpu.mig", "MIG instances"),
    "timeslice": ("gpu.slot", "slots"),
    "mps": ("gpu.slot", "slots"),
}
MODEL_COUNTS = ("total", "allocatable", "allocated", "reserved", "available")


def _bar(row: dict[str, Any]) -> str:
    """A small stacked bar of allocated (red), reserved (yellow) and available (green) out of allocatable."""
    scale = max(row["allocatable"], row["allocated"] + row["reserved"], 1)
    allocated = round(BAR_WIDTH * row["allocated"] / scale)
    reserved = round(BAR_WIDTH * row["reserved"] / scale)
    available = max(0, min(BAR_WIDTH - allocated - reserved, round(BAR_WIDTH * row["available"] / scale)))
    rest = BAR_WIDTH - allocated - reserved - available
    return (
        f"[red]{'█' * allocated}[/red][yellow]{'█' * reserved}[/yellow]"
        f"[green]{'█' * available}[/green][dim]{'·' * max(0, rest)}[/dim]"
    )
