"""The API document as clients read it: served at /api/schema/, committed as docs/openapi.json.

It is valid OpenAPI, it is the committed file (so every API change is a diff of
that file in review), every method declares every answer it gives, its names
read well in generated code, and its rules are written where a reader sees them.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from rest_framework.test import APIClient
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.paths import ROOT

COMMITTED = ROOT / "docs" / "openapi.json"
# What each method may answer beyond the answers every method gives, as the contract says.
CONFLICTS = {
    "reservations.create",
    "reservations.renew",
    "pools.create",
    "pools.update",
    "offerings.create",
    "offerings.update",
    "offerings.withdraw",
    "inventory.report",
    "nodes.register",
    # A window that meets another, or a booking its extension would cover (named in the answer).
    "nodes.planMaintenance",
    "nodes.scheduleMaintenance",
    "nodes.updateMaintenance",
    "nodes.cancelMaintenance",
}
RATE_LIMITED = {"reservations.create", "reservations.release", "reservations.renew"}


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    document: dict[str, Any] = json.loads(response.content)
    return document


def operations(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["post"]["operationId"]: item["post"] for item in document["paths"].values()}


def test_the_served_document_is_the_committed_one(served: dict[str, Any]) -> None:
    committed = json.loads(COMMITTED.read_text())
    assert served == committed, "the API changed: run `make openapi` and review the diff of docs/openapi.json"


def test_the_document_is_valid_openapi(served: dict[str, Any]) -> None:
    assert served["openapi"].startswith("3.1")
    validate(served)


def test_every_method_declares_every_answer_with_the_envelope(served: dict[str, Any]) -> None:
    methods = operations(served)
    assert len(methods) == 40
    for name, operation in methods.items():
        answers = operation["responses"]
        expected = {"400", "401", "403", "404", "default"}
        expected |= {"409"} if name in CONFLICTS else set()
        expected |= {"429"} if name in RATE_LIMITED else set()
        errors = {status for status in answers if status == "default" or status >= "400"}
        assert errors == expected, name
        for status in errors:
            schema = answers[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Error"}, (name, status)
        if name in RATE_LIMITED:
            assert answers["429"]["headers"]["Retry-After"]["schema"]["type"] == "integer", name
        assert operation["requestBody"]["required"] is True, name


def test_a_create_declares_its_replay_beside_its_201(served: dict[str, Any]) -> None:
    answers = operations(served)["reservations.create"]["responses"]
    assert {"200", "201"} <= set(answers)
    for status in ("200", "201"):
        schema = answers[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ReservationOutput"}
    assert "idempotencyKey" in answers["200"]["description"]


def test_component_names_read_well_in_generated_code(served: dict[str, Any]) -> None:
    names = set(served["components"]["schemas"])
    assert "ReservationRequest" in names
    assert not [name for name in names if name.endswith(("RequestRequest", "InputRequest"))]
    # Enums are named for what they hold, not `StateEnum`.
    assert not [name for name in names if name.endswith("Enum")]
    assert {"ErrorCode", "ReservationState", "DeviceClass", "Sharing"} <= names
    for name, operation in operations(served).items():
        group, method = name.split(".")
        assert operation["tags"] == [group] and method.isidentifier()


def test_request_objects_refuse_unknown_fields(served: dict[str, Any]) -> None:
    for name, operation in operations(served).items():
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        body = served["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        assert body["additionalProperties"] is False, name


def test_a_pool_may_be_created_with_the_default_gang_topology_key(served: dict[str, Any]) -> None:
    field = served["components"]["schemas"]["PoolCreateInput"]["properties"]["gangTopologyKey"]
    assert field["default"] == ""
    validate(served)  # the default satisfies its own schema (the validator checks defaults)


def test_the_rules_no_schema_states_are_in_each_description(served: dict[str, Any]) -> None:
    ruled = {name: op for name, op in operations(served).items() if op.get("x-rules")}
    assert {"reservations.create", "capacity.preview", "capacity.timeline", "usage.hourly"} <= set(ruled)
    for name, operation in ruled.items():
        for rule in operation["x-rules"]:
            assert rule["rule"] in operation["description"], name
            assert rule["fields"], name


@pytest.mark.django_db(transaction=True)
def test_the_docs_page_shows_the_method_path_as_written(live_server: Any, browser: WebDriver) -> None:
    """Swagger UI renders the description as Markdown: `<group>/<method>` must not be read as HTML."""
    browser.get(f"{live_server.url}/api/docs/")
    WebDriverWait(browser, 20).until(
        lambda driver: driver.find_elements(By.CSS_SELECTOR, ".info .description")
    )
    text = browser.find_element(By.CSS_SELECTOR, ".info .description").text
    assert "POST /api/compute/<group>/<method>" in text, text


# --- The breaking-change check `make openapi` runs (tools/openapi_breaking.py), as a CLI -------------


def breaks(old: dict[str, Any], new: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    result = subprocess.run(
        [sys.executable, "tools/openapi_breaking.py", str(tmp_path / "old.json"), str(tmp_path / "new.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode, result.stdout


def test_an_addition_is_not_a_break(tmp_path: Path) -> None:
    old = json.loads(COMMITTED.read_text())
    new = copy.deepcopy(old)
    new["components"]["schemas"]["ReservationOutput"]["properties"]["note"] = {"type": "string"}
    new["components"]["schemas"]["ReservationRefInput"]["properties"]["note"] = {"type": "string"}
    new["paths"]["/api/compute/reservations/hold"] = new["paths"]["/api/compute/reservations/get"]
    assert breaks(old, new, tmp_path) == (0, "")


def test_each_kind_of_break_is_named(tmp_path: Path) -> None:
    old = json.loads(COMMITTED.read_text())
    new = copy.deepcopy(old)
    del new["paths"]["/api/compute/pools/archive"]
    del new["paths"]["/api/compute/reservations/create"]["post"]["responses"]["200"]
    del new["components"]["schemas"]["ReservationOutput"]["properties"]["leaseExpiresAt"]
    new["components"]["schemas"]["ReservationListInput"]["required"].append("poolId")
    code, out = breaks(old, new, tmp_path)
    assert code == 1
    assert "/api/compute/pools/archive: method removed" in out
    assert "/api/compute/reservations/create: status 200 removed" in out
    assert "/api/compute/reservations/get 200.leaseExpiresAt: response field removed" in out
    assert "/api/compute/reservations/list body.poolId: request field now required" in out


def document_patterns(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
        found |= set(node.get("patternProperties", {}))
        return found.union(*(document_patterns(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(document_patterns(value) for value in node))
    return set()


# Characters where Python's `re` and ECMA-262 disagree (`\s`, `$` before a final newline) and plain ones.
PROBES = [chr(c) for c in (*range(0x09, 0x0E), *range(0x1C, 0x21), 0x85, 0xA0, 0x2028, 0x3000, 0xFEFF)] + [
    "a",
    "0",
    "-",
    "_",
]


def test_every_pattern_means_to_a_client_what_it_means_to_the_server(served: dict[str, Any]) -> None:
    """A JSON Schema validator reads the document's patterns as ECMA-262; the server matches them with
    Python's `re.fullmatch`. On every character where the two engines can differ, they agree."""
    import re

    import jsonschema_rs

    for pattern in sorted(document_patterns(served)):
        ecma = jsonschema_rs.validator_for({"type": "string", "pattern": pattern})
        for probe in PROBES:
            for text in (probe, f"a{probe}", f"{probe}a", f"node.a{probe}", f"a{probe}\n"):
                python = re.fullmatch(pattern, text) is not None
                assert ecma.is_valid(text) == python, (pattern, text)
