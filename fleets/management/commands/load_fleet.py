"""`load_fleet FILE`: load a fleet file (idempotent) and print the ids as JSON."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console

from core.errors import Conflict, InvalidInput
from core.json_input import json_loads_strict
from core.progress import progress_bar
from fleets.load import fleet_load


class Command(BaseCommand):
    help = "Load a fleet file (tenants, pools, offerings, nodes and their reports); print the ids as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the fleet JSON file")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        try:
            # Strict: UTF-8, no repeated keys, no NUL or unpaired surrogate in any string.
            data = json_loads_strict(path.read_bytes())
        except OSError as exc:
            raise CommandError(f"{path}: {exc}") from exc
        except InvalidInput as exc:
            raise CommandError(f"{path}: refused, nothing was loaded: {exc.message}") from exc
        # Progress goes to stderr and only on a terminal, so stdout stays the JSON answer.
        console = Console(stderr=True)
        started = time.monotonic()
        try:
            if console.is_terminal:
                with progress_bar("loading nodes", console=console) as bar:
                    task = bar.add_task(
                        "nodes", total=len(data.get("nodes", [])) if isinstance(data, dict) else 0
                    )
                    ids = fleet_load(data=data, progress=lambda done, total: bar.update(task, completed=done))
            else:
                ids = fleet_load(data=data)
        except InvalidInput as exc:
            lines = [f"{path}: refused, nothing was loaded"]
            lines += [f"  {d['field']}: {d.get('message', '')}" for d in exc.details[:50]]
            if len(exc.details) > 50:
                lines.append(f"  ... and {len(exc.details) - 50} more")
            raise CommandError("\n".join(lines)) from exc
        except Conflict as exc:
            # A MIG/slot layout change refused by the atom rule: the whole load rolled back.
            raise CommandError(f"{path}: refused, nothing was loaded: {exc.message}") from exc
        self.stdout.write(json.dumps(ids, indent=2, sort_keys=True))
        if console.is_terminal:
            elapsed = time.monotonic() - started
            console.print(f"loaded {len(ids['pools'])} pools and {len(ids['nodes'])} nodes in {elapsed:.1f}s")
        sys.stdout.flush()
