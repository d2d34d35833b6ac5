"""JSON in and out: the checks before parsing, the strict parser, the negotiation, the escaping renderer."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import JSONParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings

from core.errors import InvalidInput
from core.json_input import json_loads_strict

JSON_MEDIA_TYPE = "application/json"


def _too_large(limit: int) -> InvalidInput:
    return InvalidInput.field("body", f"the request body is too large (at most {limit} bytes)")


def check_json_body(request: Request) -> None:
    """Refuse a body that is too large, empty, or not declared as JSON, before parsing it."""
    meta = request.META
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        raise _too_large(limit)
    media_type = (request.content_type or "").split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise InvalidInput.field("body", "Content-Type must be application/json")
    if length == 0:
        raise InvalidInput.field("body", "must be a JSON object")


class StrictJSONParser(JSONParser):
    """JSON only, parsed by `core.json_input.json_loads_strict`: the one place a body's strings are checked.

    The size limit is checked before a byte is read (see `RpcViewSet.initial`)
    and again here, on what the stream really holds. UTF-8 only; NUL
    characters, unpaired surrogates, repeated keys, `NaN` and integers longer
    than any field takes are `INVALID_INPUT` naming their field, so nothing
    after this point (a serializer, the database, the renderer) meets them.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1 if limit is not None else -1) if stream is not None else b""
        if limit is not None and len(raw) > limit:
            raise _too_large(limit)
        return json_loads_strict(raw)


class EscapedJSONRenderer(JSONRenderer):
    """JSON with `<`, `>` and `&` written as `\\u003c`, `\\u003e`, `\\u0026`.

    Error details name the fields a client sent (an unknown field is echoed
    back by name). The escapes are the same JSON to every client, but no
    browser that sniffs the answer as HTML finds live markup in it. In JSON
    these characters only occur inside strings, so the replacement is exact.
    """

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        try:
            rendered: bytes = super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            # A string no UTF-8 encoder can write (an unpaired surrogate) got past
            # the parser: written as ASCII escapes rather than failing after the
            # view (or the exception handler) has answered.
            rendered = json.dumps(
                data, ensure_ascii=True, cls=self.encoder_class, separators=(",", ":")
            ).encode()
        return rendered.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")


# What a client that asks for JSON, or for anything, sends as `Accept`; None: no header at all
# (an empty header accepts nothing, and DRF answers it 406).
_PLAIN_ACCEPTS = frozenset({None, "*/*", JSON_MEDIA_TYPE})


class JSONNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, with its answer for the plain case known in advance.

    Every method answers JSON only. A request with no `Accept`, `*/*` or
    `application/json`, and no `?format=`, gets the JSON renderer and
    `application/json`, as DRF's own parsing of the header would say (about
    35 µs of each request's CPU); anything else is negotiated by DRF, which
    answers 406 where JSON is not acceptable.
    """

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)
        if (
            format_suffix is None
            and len(renderers) == 1
            and renderers[0].media_type == JSON_MEDIA_TYPE
            and request.META.get("HTTP_ACCEPT") in _PLAIN_ACCEPTS
            and api_settings.URL_FORMAT_OVERRIDE not in request.GET
        ):
            return renderers[0], JSON_MEDIA_TYPE
        chosen: tuple[BaseRenderer, str] = super().select_renderer(request, renderers, format_suffix)
        return chosen
