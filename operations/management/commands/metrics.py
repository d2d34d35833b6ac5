"""`manage.py metrics`: one scrape on stdout, as `GET /metrics` answers it (for promtool, or a look)."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

from operations.metrics.process import process_exposition
from operations.metrics.scrape import database_families
from operations.metrics.text import render


class Command(BaseCommand):
    help = "Print the Prometheus scrape of this database (and this process's own counters, all zero)."

    def handle(self, *args: Any, **options: Any) -> None:
        sys.stdout.write(render(database_families()))
        sys.stdout.write(process_exposition().decode())
