"""The request id: the client's `X-Request-ID` when it is safe to repeat, else a new one; on every answer.

It is kept on the request (`request.request_id`) and in a context variable,
which the error envelope (`core.api.envelope.error_body`, called where no
request is at hand) and the log formatter (`core.logs`) read. Outside a request
(a command, the worker) there is none, and neither adds one.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from core.ids import new_id

HEADER = "X-Request-ID"
PREFIX = "req"
# Echoed in a header, a log line and a JSON body: a bounded run of characters none of them must escape.
_SAFE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
API_PREFIX = "/api/compute/"

# The request being answered in this thread or task; None outside a request.
_current: ContextVar[HttpRequest | None] = ContextVar("current_request", default=None)

request_logger = logging.getLogger("better_compute.request")


def request_id_for(header: str | None) -> str:
    """The client's id when it is a safe run (1 to 128 of `A-Za-z0-9._:-`), else a new `req_…`."""
    if header is not None and _SAFE.fullmatch(header):
        return header
    return new_id(PREFIX)


def current_request() -> HttpRequest | None:
    return _current.get()


def current_request_id() -> str | None:
    """The id of the request being answered, or None (no request: a command, the worker)."""
    return request_id_of(_current.get())


def request_id_of(request: Any) -> str | None:
    found = getattr(request, "request_id", None)
    return found if isinstance(found, str) else None


def api_method(request: HttpRequest) -> str:
    """`reservations/create` for a method the API has, else the path (an unknown URL is no method)."""
    match = getattr(request, "resolver_match", None)
    if match is not None and match.url_name is not None and request.path.startswith(API_PREFIX):
        return request.path[len(API_PREFIX) :]
    return request.path


class RequestIdMiddleware:
    """Outermost but for SecurityMiddleware: every answer has the header (errors, 404s, admin, `/healthz`).

    Sync and async (the agents process runs only async-capable middleware).
    It also writes the request line (`better_compute.request`, INFO; on only
    under `LOG_FORMAT=json`, where it stands in for gunicorn's access line).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self._acall(request)
        started = _begin(request)
        token = _current.set(request)
        try:
            response: HttpResponseBase = self.get_response(request)
            return _end(request, response, started)
        finally:
            _current.reset(token)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        started = _begin(request)
        token = _current.set(request)
        try:
            answer: Awaitable[HttpResponseBase] = self.get_response(request)
            return _end(request, await answer, started)
        finally:
            _current.reset(token)


def _begin(request: HttpRequest) -> float:
    request.request_id = request_id_for(request.headers.get(HEADER))  # type: ignore[attr-defined]
    return time.perf_counter()


def _end(request: HttpRequest, response: HttpResponseBase, started: float) -> HttpResponseBase:
    response[HEADER] = request_id_of(request) or ""
    if request_logger.isEnabledFor(logging.INFO):
        line = {
            "method": api_method(request),
            "path": request.path,
            "httpMethod": request.method,
            "status": response.status_code,
            "durationMs": round((time.perf_counter() - started) * 1000, 1),
        }
        # The request itself too, as Django's own request records carry it: a handler that
        # formats later (a queue, a test's capture) still finds its id and tenant.
        extra = {"request": request, "request_line": line}
        request_logger.info("%s %s %s", request.method, request.path, response.status_code, extra=extra)
    return response
