"""Hostile input: schemathesis against the published schema, property tests of every parser, and bad bodies.

What must hold whatever a client sends: no 5xx, every error in the contract's
envelope, every answer JSON (so nothing a client sent can be rendered as a
page), and every parser either answers or raises its own documented error,
never anything else.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.http.request import split_domain_port, validate_host
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from capacity.cli_device_match import SelectorSyntaxError, parse_cli_selector, selector_to_cli
from config.wsgi import application
from core.durations import DurationError, format_duration, parse_duration
from core.errors import MAX_ERROR_DETAILS, InvalidInput
from core.services import token_issue
from inventory.reports import report_parse
from reservations.request.device_match import normalize_selector, selector_to_api
from tests.support.api import bearer_client, post, post_raw
from tests.support.envelope import MARKUP, assert_contract_answer, content_type_of
from tests.support.factories import TenantFactory

EXAMPLES = 20

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@pytest.mark.django_db
def test_every_method_answers_a_caller_without_a_credential_in_the_envelope_and_never_5xx(
    case: Any, personas: dict[str, str | None]
) -> None:
    """The same answer holds for an operator's and a member's calls: `test_schema_truth` asserts it on
    each of its cases, beside the document's own checks (one call per case, not one per test)."""
    response = case.call()
    assert_contract_answer(response.status_code, content_type_of(response), response.content)
    if case.path.startswith("/api/compute/") and _host_refused(case.headers):
        # Django refuses a Host it does not serve before any view, credential or not (even an
        # empty one, which the generator sends): the envelope's 400, as `test_api` shows.
        assert response.status_code == 400
        assert json.loads(response.content)["error"]["code"] == "INVALID_INPUT"
    elif case.path.startswith("/api/compute/"):
        assert response.status_code == 401


def _host_refused(headers: dict[str, str] | None) -> bool:
    """Whether a case names a Host that Django's `get_host` refuses, by the same rule."""
    for name, value in (headers or {}).items():
        if name.lower() == "host":
            allowed = django_settings.ALLOWED_HOSTS
            if django_settings.DEBUG and not allowed:
                allowed = [".localhost", "127.0.0.1", "[::1]"]
            domain, _ = split_domain_port(value)
            return not (domain and validate_host(domain, allowed))
    return False


# The hostile strings: what a hand-written client can put in any JSON string or field name.
HOSTILE_STRINGS = ["\x00", "H1\x0000", "\ud800", "x\udfff", "acme\n", "\n", MARKUP]
# Unknown fields added to a generated body: none, a few, or thousands (the 1 MiB attack, scaled down).
UNKNOWN_FIELD_COUNTS = [0, 3, 5_000]


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """Every place a string sits in `value`: ("value", path) for a string, ("key", path) for a field name."""
    found: list[tuple[tuple[Any, ...], str]] = []
    if isinstance(value, str):
        found.append((path, "value"))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.append(((*path, key), "key"))
            found.extend(_slots(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_slots(item, (*path, index)))
    return found


def with_hostile_string(body: Any, hostile: str, where: int) -> Any:
    """`body` with one of its strings (a value or a field name) replaced by, or suffixed with, `hostile`."""
    if not isinstance(body, dict):
        return {"tenantId": hostile}
    body = json.loads(json.dumps(body))
    slots = _slots(body)
    if not slots:
        return {**body, hostile: hostile}
    path, kind = slots[where % len(slots)]
    parent: Any = body
    for step in path[:-1]:
        parent = parent[step]
    if kind == "key":
        parent[f"{path[-1]}{hostile}"] = parent.pop(path[-1])
    else:
        parent[path[-1]] = hostile if where % 2 else f"{parent[path[-1]]}{hostile}"
    return body


@schema.parametrize()
@schema.given(
    hostile=st.sampled_from(HOSTILE_STRINGS),
    where=st.integers(min_value=0, max_value=1_000),
    unknown=st.sampled_from(UNKNOWN_FIELD_COUNTS),
)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    # The schema's own examples carry no hostile string; `@schema.given` cannot be combined with them.
    phases=[phase for phase in Phase if phase is not Phase.explicit],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@pytest.mark.django_db
def test_hostile_strings_and_unknown_fields_in_any_body_never_5xx(
    case: Any, hostile: str, where: int, unknown: int, personas: dict[str, str | None]
) -> None:
    """A generated body with a NUL, a lone surrogate, a trailing newline or markup put in one of its
    strings or field names, and up to thousands of unknown fields: an answer in the envelope, never a 5xx,
    and never an error reply much larger than the body."""
    body = with_hostile_string(case.body, hostile, where)
    if isinstance(body, dict):
        body.update({f"unknown{i:05d}": i for i in range(unknown)})
    raw = json.dumps(
        body, ensure_ascii=True
    ).encode()  # NUL and surrogates as \u escapes, as a client sends them
    client = bearer_client(str(personas["member" if where % 3 else "operator"]))
    response = client.generic(case.method.upper(), case.formatted_path, raw, content_type="application/json")
    answer = assert_contract_answer(response.status_code, response["Content-Type"], response.content)
    if response.status_code >= 400:
        # The first details, the count of the rest, and the request id.
        assert len(answer["error"]["details"]) <= MAX_ERROR_DETAILS + 2
        assert len(response.content) < 16_384


# --- Bodies that are not what the contract asks for ----------------------------------------


@pytest.fixture
def member(db: Any) -> APIClient:
    TenantFactory(id="acme")
    return bearer_client(token_issue(tenant_id="acme", role="member")[1])


def post_summary(client: APIClient, body: bytes | str, content_type: str = "application/json") -> Any:
    """A raw body to `capacity/summary`; its status and its answer, checked against the contract."""
    response = post_raw(client, "capacity/summary", body, content_type)
    body_json = assert_contract_answer(response.status_code, response["Content-Type"], response.content)
    return response.status_code, body_json


def test_a_huge_body_is_refused_with_a_clear_error(member: APIClient) -> None:
    limit = django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    huge = json.dumps({"tenantId": "acme", "padding": "x" * (limit + 1)})
    status, body = post_summary(member, huge)
    assert status == 400 and body["error"]["code"] == "INVALID_INPUT"
    assert "too large" in body["error"]["message"] and body["error"]["details"][0]["field"] == "body"


@pytest.mark.parametrize("depth", [64, 2_000, 200_000])
def test_a_deeply_nested_body_is_invalid_input(member: APIClient, depth: int) -> None:
    status, body = post_summary(member, '{"tenantId": "acme", "x": ' + "[" * depth + "]" * depth + "}")
    assert status == 400 and body["error"]["code"] == "INVALID_INPUT"


@pytest.mark.parametrize("depth", [64, 5_000])
def test_a_deeply_nested_selector_is_invalid_input(member: APIClient, depth: int) -> None:
    nested = '{"eq": ' * depth + "1" + "}" * depth
    request = (
        '{"tenantId": "acme", "poolId": "pool_' + "0" * 26 + '", "duration": "1h", "idempotencyKey": "k",'
        ' "devices": [{"class": "gpu", "count": 1, "selector": {"vramGiB": ' + nested + "}}]}"
    )
    response = post_raw(member, "capacity/preview", request)
    body = assert_contract_answer(response.status_code, response["Content-Type"], response.content)
    assert response.status_code == 400 and body["error"]["code"] == "INVALID_INPUT"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"{",
        b"[]",
        b"null",
        b"42",
        b'"acme"',
        b"\xff\xfe\x00",
        b'{"tenantId": NaN}',
        b'{"tenantId": "acme", "tenantId": "beta"}',
        b"\x00" * 64,
        '{"tenantId": "\ud800"}'.encode(errors="surrogatepass"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_invalid_input(member: APIClient, raw: bytes) -> None:
    status, body = post_summary(member, raw)
    # A repeated key is refused too (Python's `json` would silently take the last one).
    assert status == 400 and body["error"]["code"] == "INVALID_INPUT"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
        "",
    ],
)
def test_a_body_of_the_wrong_content_type_is_invalid_input(member: APIClient, content_type: str) -> None:
    status, body = post_summary(member, '{"tenantId": "acme"}', content_type=content_type)
    assert status == 400 and body["error"]["code"] == "INVALID_INPUT"
    assert "Content-Type" in body["error"]["message"]


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE"])
def test_other_http_methods_answer_in_the_envelope(member: APIClient, method: str) -> None:
    response = member.generic(method, "/api/compute/capacity/summary", "{}", content_type="application/json")
    assert_contract_answer(response.status_code, response["Content-Type"], response.content)
    assert response.status_code in (400, 405)


def test_markup_in_field_names_and_values_is_never_echoed_live(member: APIClient) -> None:
    for body in (
        {"tenantId": MARKUP},
        {MARKUP: 1, "tenantId": "acme"},
        {"tenantId": "acme", "poolId": MARKUP},
    ):
        post_summary(member, json.dumps(body))
    request = {
        "tenantId": "acme",
        "poolId": "pool_" + "0" * 26,
        "duration": MARKUP,
        "idempotencyKey": "k",
        "devices": [{"class": MARKUP, "count": 1, "selector": {MARKUP: {"eq": MARKUP}}}],
    }
    response = post(member, "capacity/preview", request)
    assert_contract_answer(response.status_code, response["Content-Type"], response.content)


def test_unknown_api_paths_answer_json_not_a_page(member: APIClient) -> None:
    for path in ("/api/compute/capacity/nope", f"/api/{MARKUP}", "/api/compute/../../etc/passwd"):
        response = member.post(path, {}, format="json")
        assert response.status_code == 404
        assert_contract_answer(response.status_code, response["Content-Type"], response.content)


# --- Property tests of the parsers ---------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
props = settings(max_examples=300, deadline=None)


@props
@given(st.one_of(json_values, st.text(alphabet="0123456789wdhmsPTWDHMS .,-+", max_size=24)))
def test_the_duration_parser_answers_seconds_in_range_or_its_own_error(value: Any) -> None:
    try:
        seconds = parse_duration(value)
    except DurationError as exc:
        assert str(exc)
        return
    assert isinstance(seconds, int) and 60 <= seconds <= 366 * 86400


@props
@given(st.integers(min_value=60, max_value=366 * 86400))
def test_the_duration_parser_reads_back_what_format_writes(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
    assert parse_duration(seconds) == seconds


attribute_names = st.sampled_from(
    ["vramGiB", "gpuModel", "numaNode", "nvlinkDomain", "migProfile", "node.rack", "node.fabric", "nope", ""]
)
operators = st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte", "in", "notIn", "exists", "bogus"])
selector_objects = st.dictionaries(
    attribute_names,
    json_values | st.dictionaries(operators, json_values, max_size=2),
    max_size=4,
)


@props
@given(st.one_of(selector_objects, json_values))
def test_the_selector_object_parser_answers_a_selector_or_invalid_input(obj: Any) -> None:
    try:
        selector = normalize_selector(obj, field="selector")
    except InvalidInput as exc:
        assert exc.details and all(d["field"].startswith("selector") for d in exc.details)
        return
    # What it accepted, it reads back the same from both of its other forms.
    assert normalize_selector(selector_to_api(selector), field="selector") == selector
    assert parse_cli_selector(selector_to_cli(selector)) == selector


@props
@given(
    st.one_of(
        st.text(max_size=60),
        st.lists(
            st.tuples(
                attribute_names,
                st.sampled_from(
                    ["=", "!=", ">", ">=", "<", "<=", " in ", " notin ", " exists", " !exists", "=="]
                ),
                st.text(alphabet='abc019."\\(), ', max_size=10),
            ),
            max_size=4,
        ).map(lambda parts: ", ".join(f"{n}{op}{v}" for n, op, v in parts)),
    )
)
def test_the_cli_selector_parser_answers_a_selector_or_a_syntax_error(text: str) -> None:
    try:
        selector = parse_cli_selector(text)
    except SelectorSyntaxError as exc:
        assert exc.details
        return
    assert parse_cli_selector(selector_to_cli(selector)) == selector


gpu_reports = st.fixed_dictionaries(
    {
        "uuid": st.one_of(st.just("GPU-5a2c1f6e-0c3b-4a8e-9d7e-1b2c3d4e5f60"), st.text(max_size=40)),
        "product": st.one_of(st.just("NVIDIA H100 80GB HBM3"), st.text(max_size=30), st.integers()),
        "memoryMiB": st.one_of(st.integers(min_value=-10, max_value=10**7), st.text(max_size=5)),
    },
    optional={
        "numaNode": json_values,
        "pciBusId": st.text(max_size=20),
        "nvlinkDomain": json_values,
        "mig": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {
                    "enabled": st.booleans(),
                    "instances": st.lists(
                        st.dictionaries(
                            st.sampled_from(["gi", "ci", "profile", "memoryMiB", "x"]), json_values
                        ),
                        max_size=3,
                    ),
                }
            ),
        ),
        "extra": json_values,
    },
)
node_reports = st.fixed_dictionaries(
    {"hostname": st.one_of(st.just("gpu-a-001"), st.text(max_size=30), st.integers())},
    optional={
        "resources": st.one_of(
            json_values, st.dictionaries(st.sampled_from(["vcpu", "memoryGiB", "x"]), json_values)
        ),
        "gpus": st.one_of(json_values, st.lists(gpu_reports, max_size=3)),
        "nics": st.one_of(
            json_values, st.lists(st.dictionaries(st.sampled_from(["pf", "vfs", "linkGbps"]), json_values))
        ),
        "disks": st.one_of(
            json_values, st.lists(st.dictionaries(st.sampled_from(["id", "sizeGiB", "media"]), json_values))
        ),
    },
)


@props
@given(st.one_of(node_reports, json_values))
def test_the_node_report_parser_answers_a_report_or_invalid_input_naming_fields(data: Any) -> None:
    try:
        report = report_parse(data=data, prefix="report.")
    except InvalidInput as exc:
        assert exc.details and all(str(d.get("field", "")).startswith("report") for d in exc.details), (
            exc.details
        )
        return
    assert report.hostname and all(gpu.uuid for gpu in report.gpus)
