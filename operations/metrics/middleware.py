"""Counts every API answer by method and status, and each create's outcome, as it leaves."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from operations.metrics.process import CREATE_OUTCOMES, CREATES, RATE_LIMITED, REQUEST_SECONDS

API_PREFIX = "/api/compute/"
CREATE_METHOD = "reservations/create"


def _method(request: HttpRequest) -> str | None:
    """`group/method` for a route the API has; None for anything else (no unbounded label values)."""
    match = getattr(request, "resolver_match", None)
    if match is None or match.url_name is None or not request.path.startswith(API_PREFIX):
        return None
    return request.path[len(API_PREFIX) :]


def _error_code(response: HttpResponse) -> str | None:
    data: Any = getattr(response, "data", None)
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            return str(error["code"])
    return None


def _outcome(status: int, code: str | None) -> str:
    if status == 201:
        return "created"
    if status < 400:
        return "replayed"
    return code if code in CREATE_OUTCOMES else "other_error"


class MetricsMiddleware:
    """Times API answers from the first middleware after the request id to the answer written."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        started = time.perf_counter()
        response = self.get_response(request)
        method = _method(request)
        if method is not None:
            status = response.status_code
            REQUEST_SECONDS.labels(method, str(status)).observe(time.perf_counter() - started)
            code = _error_code(response) if status >= 400 else None
            if code == "RATE_LIMITED":
                RATE_LIMITED.labels(method).inc()
            if method == CREATE_METHOD:
                CREATES.labels(_outcome(status, code)).inc()
        return response
