"""The published document tells the truth: schemathesis runs every one of its checks on every method.

Among them, "a schema-valid request is accepted": a body the document admits
may be refused only for a rule the document lists as the method's `x-rules`
(what no JSON Schema keyword can state, such as `to` within 31 days of `from`).
So a 400 is excused only when every field it names is a listed rule's field,
and every other failure of any check fails the test.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import RejectedPositiveData

from config.wsgi import application
from tests.support.envelope import assert_contract_answer, content_type_of, error_details

# The test run draws the same cases every time, so that CI does not depend on luck; `make soak` draws
# new ones, four times as many, which is how the next divergence between document and server is found.
SOAK = os.environ.get("SOAK") == "1"
EXAMPLES = 100 if SOAK else 25

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
load_all_checks()
EVERY_CHECK = list(CHECKS.get_all())


def rule_fields(case: Any) -> set[str]:
    """The fields of the method's listed rules, as the document states them (`devices[].sharing`)."""
    rules = case.operation.definition.raw.get("x-rules", [])
    return {field for rule in rules for field in rule["fields"]}


def field_pattern(path: str) -> str:
    """`devices[3].sharing` as a rule names it: `devices[].sharing`."""
    return re.sub(r"\[\d+\]", "[]", path)


def excused(failure: Exception, response: Any, allowed: set[str]) -> bool:
    """A schema-valid body refused only for listed rules."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 400:
        return False
    details = error_details(json.loads(response.content))
    return bool(details) and all(field_pattern(d["field"]) in allowed for d in details)


def test_every_check_is_run() -> None:
    names = {check.__name__ for check in EVERY_CHECK}
    assert {"positive_data_acceptance", "negative_data_rejection", "response_schema_conformance"} <= names
    assert len(names) >= 14


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=not SOAK,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@pytest.mark.django_db
@pytest.mark.parametrize("credential", ["operator", "member"])
def test_every_check_passes_on_every_method(
    case: Any, personas: dict[str, str | None], credential: str
) -> None:
    headers = {"Authorization": f"Bearer {personas[credential]}"}
    response = case.call(headers=headers)
    # The contract's answer, whatever the document says: no 5xx, JSON, an error exactly the envelope.
    assert_contract_answer(response.status_code, content_type_of(response), response.content)
    try:
        case.validate_response(response, checks=EVERY_CHECK, headers=headers)
    except FailureGroup as group:
        allowed = rule_fields(case)
        left = [failure for failure in group.exceptions if not excused(failure, response, allowed)]
        if left:
            raise
