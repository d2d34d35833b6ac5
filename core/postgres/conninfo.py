"""Django's connection settings as a psycopg conninfo, for a connection of a process's own.

The auth cache, the release waits and the worker each hold a LISTEN session
beside Django's connections; a test fills a database with psycopg directly.
Each needs the very parameters Django connects with, less the ones that are
Django's own objects (its cursor class, its adapters context) or tuning of
Django's connection (`prepare_threshold`).
"""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.db import connections

# What `get_connection_params` gives that is not a libpq parameter.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def conninfo_of(alias: str = "default") -> str:
    """The libpq conninfo of the database `alias` names."""
    params = connections[alias].get_connection_params()
    return psycopg.conninfo.make_conninfo(
        "", **{k: v for k, v in params.items() if k not in _DJANGO_ONLY and isinstance(v, str | int)}
    )


def session_alias() -> str:
    """The alias a session of its own (LISTEN) connects through.

    Behind a transaction pooler, the `direct` alias (`DATABASE_DIRECT_URL`,
    `config/database.py`) reaches the primary itself.
    """
    return "direct" if "direct" in settings.DATABASES else "default"
