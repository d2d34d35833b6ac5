"""The URLs of the `agents` process (an ASGI server): the agents' long poll, and its health.

Only `nodes/assignments` is here, as an async view that waits without a thread
(`operations.api.agent_poll`); every other method is the web process's. Any
other path answers the envelope's NOT_FOUND.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from core.api.envelope import api_not_found
from operations.api.agent_poll import assignments
from reservations.delivery.bell import bell


def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the process runs; `waiting` long polls and whether its LISTEN connection is up."""
    return JsonResponse({"status": "ok", "listening": bell.listening, "waiting": bell.waiting()})


urlpatterns = [
    path("api/compute/nodes/assignments", assignments),
    path("healthz", healthz),
]

handler404 = api_not_found
