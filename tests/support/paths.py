"""Where things are on disk."""

from __future__ import annotations

from pathlib import Path

# The repository: the working directory of `manage.py`, the server processes and the demo fleet.
ROOT = Path(__file__).resolve().parents[2]
