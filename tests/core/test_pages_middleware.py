"""The admin's sessions, user and messages: set up for pages, passed over by the API's methods."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from core.pages_middleware import AuthenticationMiddleware, MessageMiddleware, SessionMiddleware


def _seen_through_the_chain(path: str) -> dict[str, bool]:
    seen: dict[str, bool] = {}

    def view(request: HttpRequest) -> HttpResponse:
        seen.update(
            session=hasattr(request, "session"),
            user=hasattr(request, "user"),
            messages=hasattr(request, "_messages"),
        )
        return HttpResponse("ok")

    # In the order of settings.MIDDLEWARE: sessions outermost, then the user, then the messages.
    chain: Any = SessionMiddleware(AuthenticationMiddleware(MessageMiddleware(view)))
    assert chain(RequestFactory().post(path)).status_code == 200
    return seen


def test_an_api_method_passes_the_admins_middleware_by() -> None:
    assert _seen_through_the_chain("/api/compute/capacity/summary") == {
        "session": False,
        "user": False,
        "messages": False,
    }


@pytest.mark.parametrize("path", ["/admin/login/", "/", "/api/docs/"])
def test_a_page_gets_its_session_user_and_messages(path: str) -> None:
    assert _seen_through_the_chain(path) == {"session": True, "user": True, "messages": True}


def test_the_settings_use_the_pages_only_classes() -> None:
    names = {name.rsplit(".", 1)[1]: name for name in settings.MIDDLEWARE}
    for cls in (SessionMiddleware, AuthenticationMiddleware, MessageMiddleware):
        assert names[cls.__name__] == f"{cls.__module__}.{cls.__name__}"
