"""The API's negotiation answers as DRF's for every `Accept`; only its plain case is known in advance."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import Http404
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from core.api.parsing import EscapedJSONRenderer, JSONNegotiation


def _choice(negotiation: Any, accept: str | None, query: str) -> tuple[Any, ...]:
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = Request(APIRequestFactory().post(f"/api/compute/capacity/summary{query}", **headers))
    try:
        renderer, media_type = negotiation.select_renderer(request, [EscapedJSONRenderer()])
    except NotAcceptable:
        return ("406",)
    except Http404:
        return ("404",)
    return type(renderer), media_type


@pytest.mark.parametrize("query", ["", "?format=json", "?format=xml", "?other=1"])
@pytest.mark.parametrize(
    "accept",
    [
        None,
        "",
        "*/*",
        "application/json",
        "application/json; indent=4",
        "application/*",
        "*/*;q=0.8",
        "text/html",
        "text/html, application/json;q=0.9",
        "APPLICATION/JSON",
    ],
)
def test_the_json_negotiation_chooses_what_drf_chooses(accept: str | None, query: str) -> None:
    assert _choice(JSONNegotiation(), accept, query) == _choice(DefaultContentNegotiation(), accept, query)


def test_a_client_that_cannot_take_json_is_told_so_in_the_envelope(client: Any) -> None:
    response = client.post(
        "/api/compute/capacity/summary", "{}", content_type="application/json", HTTP_ACCEPT="text/html"
    )
    assert response.status_code == 406
    assert response.json()["error"]["code"]
