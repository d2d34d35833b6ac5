"""The two pages outside the admin and the API: the landing page and the health check."""

from __future__ import annotations

from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


def landing(request: HttpRequest) -> HttpResponse:
    """What a newcomer opening the server's address sees: where the admin, the API and its docs are."""
    return render(request, "core/landing.html")


def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the service can answer (its database replies), else 503 with the reason.

    For load balancers and `make run`'s users; it reads no tenant data.
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT compute_now()")
            cursor.fetchone()
    except DatabaseError as error:
        return JsonResponse(
            {"status": "unavailable", "reason": f"database: {error.__class__.__name__}"}, status=503
        )
    return JsonResponse({"status": "ok"})
