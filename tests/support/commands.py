"""Management commands run in-process."""

from __future__ import annotations

import io
from typing import Any

from django.core.management import call_command


def run_command(name: str, *args: str, **options: Any) -> str:
    """Run command `name` and return what it printed on stdout."""
    out = io.StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()
