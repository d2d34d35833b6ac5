"""`make_fleet`: write a synthetic, realistic and deterministic fleet file (for benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleets.synthetic import fleet_generate


class Command(BaseCommand):
    help = "Write a synthetic fleet file: the same file for the same arguments and seed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--nodes", type=int, required=True)
        parser.add_argument("--gpus-per-node", type=int, default=8)
        parser.add_argument(
            "--pools", type=int, default=None, help="default: about one pool per 8 nodes, 12 at most"
        )
        parser.add_argument("--mig-share", type=float, default=0.2, help="share of pools in MIG mode (0-1)")
        parser.add_argument(
            "--timeslice-share", type=float, default=0.1, help="share of time-slice pools (0-1)"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--out", required=True, help="the file to write ('-' for stdout)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["nodes"] < 0 or not 1 <= options["gpus_per_node"] <= 16:
            raise CommandError("--nodes must be >= 0 and --gpus-per-node between 1 and 16")
        if options["pools"] is not None and options["pools"] < 1:
            raise CommandError("--pools must be at least 1")
        for name in ("mig_share", "timeslice_share"):
            if not 0 <= options[name] <= 1:
                raise CommandError(f"--{name.replace('_', '-')} must be between 0 and 1")
        fleet = fleet_generate(
            nodes=options["nodes"],
            gpus_per_node=options["gpus_per_node"],
            pools=options["pools"],
            mig_share=options["mig_share"],
            timeslice_share=options["timeslice_share"],
            seed=options["seed"],
        )
        text = json.dumps(fleet, separators=(",", ":"))
        if options["out"] == "-":
            self.stdout.write(text)
            return
        Path(options["out"]).write_text(text + "\n")
        self.stderr.write(
            f"wrote {len(fleet['nodes'])} nodes in {len(fleet['pools'])} pools to {options['out']}"
        )
