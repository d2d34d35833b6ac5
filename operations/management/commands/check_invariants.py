"""`manage.py check_invariants`: every invariant of the ledger, checked against the database it points at.

An operator runs it after a failover, a restore or a repair: it reads one
snapshot and writes nothing (`operations.invariants`), prints each invariant
with `ok` or its problems, and exits 1 when any fails.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.invariants import invariant_report

SHOWN = 20


class Command(BaseCommand):
    help = "Check every invariant of the ledger (read-only); exit 1 when one fails."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON object: {invariant: [problems]}")

    def handle(self, *args: Any, **options: Any) -> None:
        report = invariant_report()
        failed = sum(1 for problems in report.values() if problems)
        if options["json"]:
            self.stdout.write(json.dumps(report))
        else:
            for name, problems in report.items():
                self.stdout.write(f"{'ok  ' if not problems else 'FAIL'} {name}")
                for problem in problems[:SHOWN]:
                    self.stdout.write(f"       {problem}")
                if len(problems) > SHOWN:
                    self.stdout.write(f"       and {len(problems) - SHOWN} more")
        if failed:
            raise CommandError(f"{failed} of {len(report)} invariants fail")
        if not options["json"]:
            self.stdout.write(f"all {len(report)} invariants hold")
