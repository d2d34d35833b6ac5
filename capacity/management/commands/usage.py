"""`usage --tenant T [--pool ID] [--project ID] [--from TIME] [--to TIME] [--csv]`.

A tenant's hourly usage, as `usage/hourly` answers it, as a table or as CSV
(every row of the window, no pages). Times are ISO 8601 (`2026-11-01`,
`2026-11-01T12:00Z`; without a zone, UTC); `--to` defaults to the end of the
current hour and `--from` to 24 hours before `--to`. At most 31 days.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from capacity.selectors.usage import UsageScope, usage_csv_write, usage_rows, usage_window
from capacity.usage import US_PER_HOUR, unit_of
from core.clock import compute_now, to_millis
from core.errors import InvalidInput
from core.models import Tenant
from inventory.models import Pool, Project


def _time(text: str, name: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CommandError(f"{name}: not an ISO 8601 time: {text!r}") from exc
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = "Show a tenant's hourly usage (atom-hours and unit-hours) as a table, or as CSV."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant whose usage to show.")
        parser.add_argument("--pool", help="Only this pool.")
        parser.add_argument("--project", help="Only this project.")
        parser.add_argument("--from", dest="start", help="ISO 8601; default 24 hours before --to.")
        parser.add_argument("--to", dest="end", help="ISO 8601; default the end of the current hour.")
        parser.add_argument("--csv", action="store_true", help="Print CSV instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id: str = options["tenant"]
        if not Tenant.objects.filter(pk=tenant_id).exists():
            raise CommandError(f"tenant {tenant_id} not found")
        pool_id: str | None = options["pool"]
        if pool_id and not Pool.objects.filter(pk=pool_id).exists():
            raise CommandError(f"pool {pool_id} not found")
        project_id: str | None = options["project"]
        if project_id and not Project.objects.filter(pk=project_id, tenant_id=tenant_id).exists():
            raise CommandError(f"project {project_id} not found for tenant {tenant_id}")
        now = compute_now()
        end = _time(options["end"], "--to") if options["end"] else now + timedelta(hours=1)
        start = _time(options["start"], "--from") if options["start"] else end - timedelta(hours=24)
        try:
            window = usage_window(from_ms=to_millis(start) or 0, to_ms=to_millis(end) or 0)
        except InvalidInput as exc:
            raise CommandError(str(exc).replace("to:", "--to:", 1)) from exc
        rows = usage_rows(
            scope=UsageScope(tenant_id=tenant_id, pool_id=pool_id, project_id=project_id), window=window
        )
        if options["csv"]:
            buffer = io.StringIO()
            usage_csv_write(rows, buffer)
            self.stdout.write(buffer.getvalue(), ending="")
            return
        self._table(tenant_id, window.start, window.end, rows)

    def _table(self, tenant_id: str, start: datetime, end: datetime, rows: list[Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(
            title=f"usage of {tenant_id}, {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC",
            title_justify="left",
        )
        for column in ("hour (UTC)", "pool", "project", "resource", "spot", "amount", "unit", "closed"):
            table.add_column(column, justify="right" if column == "amount" else "left")
        for row in rows:
            table.add_row(
                f"{row.hour:%Y-%m-%d %H:%M}",
                row.pool_id,
                row.project_id or "-",
                row.resource,
                "spot" if row.spot else "",
                f"{row.usage_us / US_PER_HOUR:.6f}",
                unit_of(row.resource),
                "yes" if row.closed else "open",
            )
        buffer = io.StringIO()
        tty = self.stdout.isatty()
        console = Console(file=buffer, force_terminal=tty, no_color=not tty, width=200)
        console.print(table)
        if not rows:
            console.print("no usage in these hours")
        self.stdout.write(buffer.getvalue(), ending="")
