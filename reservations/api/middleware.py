"""The reservations app's HTTP middleware: a request's deliveries to the nodes wait for its response."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest
from django.http.response import HttpResponseBase

from reservations.delivery.outbox import deliveries_hold


class DeliverAfterResponse:
    """Middleware: deliveries committed by a request are sent after its response, not before.

    A WSGI server sends `request_finished` when it closes the response, after
    writing it to the client; the deliveries the request committed run then,
    on the same thread (`reservations.delivery.outbox`).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        deliveries_hold()
        return self.get_response(request)
