"""The admin's sessions, signed-in user and messages, passed over by the API's methods.

A method under `/api/compute/` authenticates by its bearer token alone
(`core.authentication`), never by a session cookie, and answers no page that
shows messages. Django's middleware still opened a session store, a message
store and a lazy user for each of them and closed them on the way out: about
0.05 to 0.1 ms of a create's or a release's CPU (`bench.profile`), for nothing
the API reads. These subclasses run Django's own for every other path (the
admin, the landing page, the API docs), and are subclasses so that the admin's
system checks (`admin.E408` to `E410`) still find them.
"""

from __future__ import annotations

from django.contrib.auth.middleware import AuthenticationMiddleware as DjangoAuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware as DjangoMessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware as DjangoSessionMiddleware
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from core.request_id import API_PREFIX


class _PagesOnly:
    """Mixin: the middleware's work for pages; a request to an API method goes straight on."""

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(API_PREFIX):
            passed: HttpResponseBase = self.get_response(request)  # type: ignore[attr-defined]
            return passed
        answered: HttpResponseBase = super().__call__(request)  # type: ignore[misc]
        return answered


class SessionMiddleware(_PagesOnly, DjangoSessionMiddleware):
    """Django's, for pages only."""


class AuthenticationMiddleware(_PagesOnly, DjangoAuthenticationMiddleware):
    """Django's, for pages only."""


class MessageMiddleware(_PagesOnly, DjangoMessageMiddleware):
    """Django's, for pages only."""
