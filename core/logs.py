"""Logs a machine can read: `LOG_FORMAT=json` writes one JSON object per line (settings' `LOGGING`).

Each line has `time` (ISO 8601, UTC), `level`, `event` (the message),
`logger`, `requestId` and `tenant` (null outside a request, or for a platform
credential), and the request line of `core.request_id` adds `method`, `path`,
`httpMethod`, `status` and `durationMs`. A traceback is one more field, `exc`,
so it stays on its line. `plain` (the default) is the message alone, as always.

`GunicornLogger` (the Procfile's `--logger-class`) writes gunicorn's own lines
the same way under `json`, and drops its access line there: the app's request
line says what it says, and the request id and tenant besides.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from gunicorn import glogging

from core.request_id import current_request, request_id_of

PLAIN, JSON = "plain", "json"
LOG_FORMATS = (PLAIN, JSON)


def log_format() -> str:
    """The environment's `LOG_FORMAT`; read here too because gunicorn's master never loads the settings."""
    return os.environ.get("LOG_FORMAT", PLAIN)


def _tenant(request: Any) -> str | None:
    """The tenant the request's credential is bound to (several: joined by commas), or None.

    Read without evaluating the admin's lazy user: only a `Principal` the
    bearer authentication set counts.
    """
    user = getattr(request, "__dict__", {}).get("user")
    if user is None:
        return None
    # Imported only in a request: gunicorn's master formats its lines before Django is set up.
    from core.decisions import principal_tenant_ids
    from core.models import Principal

    if not issubclass(type(user), Principal):
        return None
    return ",".join(principal_tenant_ids(user)) or None


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        # Django's own request records (`django.request`'s 4xx and 5xx) carry the request,
        # and are written after the middleware chain has returned.
        request = getattr(record, "request", None)
        if request_id_of(request) is None:
            request = current_request()
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        line: dict[str, Any] = {
            "time": when.replace("+00:00", "Z"),
            "level": record.levelname,
            "event": record.getMessage(),
            "logger": record.name,
            "requestId": request_id_of(request),
            "tenant": _tenant(request),
        }
        request_line = getattr(record, "request_line", None)
        if isinstance(request_line, dict):
            line.update(request_line)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, default=str)


class GunicornLogger(glogging.Logger):
    """gunicorn's logger, as is under `plain`; under `json`, its lines JSON and its access line off."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        if log_format() == JSON:
            for handler in self.error_log.handlers:
                handler.setFormatter(JsonFormatter())

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if log_format() != JSON:
            super().access(resp, req, environ, request_time)
