"""A Python client generated from the served document works, as a consumer would use it.

openapi-python-client (pinned in requirements-dev.txt) generates the client
from `GET /api/schema/` of a live server, as the README's "Generate a client"
says; the README's "Try it" flow then runs through it with
`raise_on_unexpected_status=True`, and every error code of the contract a test
can provoke comes back parsed as the declared envelope. A status the document
left out would raise `UnexpectedStatus` or come back as the wrong type.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
from django.core.management import call_command

from core.services import token_issue
from fleets.load import fleet_load
from tests.support.paths import ROOT

PACKAGE = "gpu_capacity_client"
GENERATOR = Path(sys.executable).parent / "openapi-python-client"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def client_package(live_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The generated package, imported from a fresh directory (and forgotten afterwards)."""
    where = tmp_path_factory.mktemp("generated")
    document = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=30)
    assert document.status_code == 200
    (where / "openapi.json").write_bytes(document.content)
    env = {**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [str(GENERATOR), "generate", "--path", "openapi.json", "--meta", "none", "--output-path", PACKAGE],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(where))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


class Generated:
    """The generated package's pieces, by the names its README gives them."""

    def __init__(self, package: ModuleType, base_url: str) -> None:
        self.package, self.base_url = package, base_url
        self.models = importlib.import_module(f"{PACKAGE}.models")

    def client(self, token: str) -> Any:
        return self.package.AuthenticatedClient(
            base_url=self.base_url, token=token, raise_on_unexpected_status=True
        )

    def call(self, operation: str, client: Any, model: str, body: dict[str, Any]) -> Any:
        """`capacity.byPool`: `api.capacity.capacity_by_pool.sync_detailed` with `Model.from_dict(body)`."""
        group, method = operation.split(".")
        snake = "".join(f"_{letter.lower()}" if letter.isupper() else letter for letter in method)
        module = importlib.import_module(f"{PACKAGE}.api.{group}.{group}_{snake}")
        return module.sync_detailed(client=client, body=getattr(self.models, model).from_dict(body))

    def error(self, response: Any, code: str, status: int) -> Any:
        assert response.status_code == status, response.content
        assert isinstance(response.parsed, self.models.Error), response.parsed
        assert response.parsed.error.code == self.models.ErrorCode(code)
        return response.parsed.error


@pytest.fixture
def api(client_package: ModuleType, live_server: Any) -> Generated:
    fleet_load(data=json.loads((ROOT / "fleets" / "demo.json").read_text()))
    call_command("worker", "--once", stdout=io.StringIO())
    return Generated(client_package, live_server.url)


def test_the_readme_flow_runs_through_the_generated_client(api: Generated) -> None:
    member = api.client(token_issue(tenant_id="acme", role="member", name="generated")[1])
    operator = api.client(token_issue(tenant_id=None, role="operator", name="generated ops")[1])
    models = api.models

    summary = api.call("capacity.summary", member, "SummaryInput", {"tenantId": "acme"})
    assert summary.status_code == 200 and isinstance(summary.parsed, models.SummaryOutput)
    pool = next(p.pool_id for p in summary.parsed.pools if p.name == "h100-east")
    by_pool = api.call("capacity.byPool", member, "ByPoolInput", {"tenantId": "acme", "poolId": pool})
    assert by_pool.parsed.pool_id == pool and by_pool.parsed.rows

    request = {
        "tenantId": "acme",
        "poolId": pool,
        "devices": [{"class": "gpu", "count": 4, "selector": {"vramGiB": {"gte": 80}}}],
        "duration": "2h",
        "idempotencyKey": "generated-1",
    }
    preview = api.call("capacity.preview", member, "ReservationRequest", request)
    assert isinstance(preview.parsed, models.PreviewOutput) and preview.parsed.fits
    earliest = api.call("capacity.earliest", member, "EarliestInput", request)
    assert isinstance(earliest.parsed, models.EarliestOutput) and earliest.parsed.fits

    created = api.call("reservations.create", member, "ReservationRequest", request)
    assert created.status_code == 201 and isinstance(created.parsed, models.ReservationOutput)
    # The retry idempotency exists for: 200, the same reservation, parsed as one.
    replay = api.call("reservations.create", member, "ReservationRequest", request)
    assert replay.status_code == 200 and isinstance(replay.parsed, models.ReservationOutput)
    assert replay.parsed.id == created.parsed.id

    ref = {"tenantId": "acme", "reservationId": created.parsed.id}
    assert api.call("reservations.get", member, "ReservationRefInput", ref).parsed.id == created.parsed.id
    listed = api.call("reservations.list", member, "ReservationListInput", {"tenantId": "acme", "limit": 5})
    assert [r.id for r in listed.parsed.reservations] == [created.parsed.id]
    timeline = api.call("capacity.timeline", member, "TimelineInput", {"tenantId": "acme", "poolId": pool})
    assert timeline.parsed.buckets
    released = api.call("reservations.release", member, "ReservationRefInput", ref)
    assert released.parsed.state == models.ReservationState.RELEASED

    nodes = api.call(
        "nodes.list", operator, "NodeListInput", {"poolId": pool, "bucket": "schedulable", "limit": 1}
    )
    node = nodes.parsed.nodes[0].id
    cordoned = api.call(
        "nodes.cordon", operator, "CordonInput", {"nodeId": node, "reason": "xid 79 on GPU 3"}
    )
    assert cordoned.parsed.cordoned is True
    usage = api.call(
        "usage.hourly", member, "UsageHourlyInput", {"tenantId": "acme", "from": 0, "to": 3_600_000}
    )
    assert isinstance(usage.parsed, models.UsageHourlyOutput)
    assert api.call("nodes.uncordon", operator, "UncordonInput", {"nodeId": node}).parsed.cordoned is False


def test_every_error_the_contract_names_comes_back_declared(api: Generated) -> None:
    member = api.client(token_issue(tenant_id="acme", role="member", name="generated")[1])
    viewer = api.client(token_issue(tenant_id="acme", role="viewer", name="generated viewer")[1])
    gamma = api.client(token_issue(tenant_id="gamma", role="member", name="generated gamma")[1])
    operator = api.client(token_issue(tenant_id=None, role="operator", name="generated ops")[1])
    summary = api.call("capacity.summary", member, "SummaryInput", {"tenantId": "acme"})
    pools = {p.name: p.pool_id for p in summary.parsed.pools}
    request = {
        "tenantId": "acme",
        "poolId": pools["h100-east"],
        "devices": [{"class": "gpu", "count": 1}],
        "duration": 3600,
        "idempotencyKey": "errors-1",
    }

    bad = api.call(
        "capacity.preview",
        member,
        "ReservationRequest",
        {**request, "devices": [{"class": "gpu", "count": 0}]},
    )
    assert api.error(bad, "INVALID_INPUT", 400).details[0].field == "devices[0].count"
    stranger = api.client("bc_not_a_token")
    api.error(
        api.call("capacity.summary", stranger, "SummaryInput", {"tenantId": "acme"}), "UNAUTHENTICATED", 401
    )
    api.error(
        api.call("reservations.create", viewer, "ReservationRequest", request), "PERMISSION_DENIED", 403
    )
    missing = {"tenantId": "acme", "reservationId": "rsv_01hzy5v6k8d9c0m7w3q2r1t4ab"}
    api.error(api.call("reservations.get", member, "ReservationRefInput", missing), "NOT_FOUND", 404)

    assert api.call("reservations.create", member, "ReservationRequest", request).status_code == 201
    other = {**request, "duration": 7200}
    api.error(api.call("reservations.create", member, "ReservationRequest", other), "CONFLICT", 409)
    huge = {**request, "devices": [{"class": "gpu", "count": 64}], "idempotencyKey": "errors-2"}
    api.error(api.call("reservations.create", member, "ReservationRequest", huge), "NO_CAPACITY", 409)
    limit = {"poolId": pools["h200-west"], "tenantId": "gamma", "quota": {"gpu": 1}}
    assert api.call("offerings.update", operator, "OfferingUpdateInput", limit).status_code == 200
    over_quota = {
        **request,
        "tenantId": "gamma",
        "poolId": pools["h200-west"],
        "devices": [{"class": "gpu", "count": 2}],
        "idempotencyKey": "errors-3",
    }
    api.error(api.call("reservations.create", gamma, "ReservationRequest", over_quota), "QUOTA_EXCEEDED", 409)
    taken = {"ownerTenantId": "acme", "name": "h100-east", "gpuModel": "H100"}
    api.error(api.call("pools.create", operator, "PoolCreateInput", taken), "CONFLICT", 409)


def test_rate_limited_comes_back_declared_with_retry_after(api: Generated, settings: Any) -> None:
    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 2
    member = api.client(token_issue(tenant_id="acme", role="member", name="generated limited")[1])
    missing = {"tenantId": "acme", "reservationId": "rsv_01hzy5v6k8d9c0m7w3q2r1t4ab"}
    answers = [api.call("reservations.release", member, "ReservationRefInput", missing) for _ in range(3)]
    assert [answer.status_code for answer in answers[:2]] == [404, 404]
    error = api.error(answers[2], "RATE_LIMITED", 429)
    assert "writes" in error.message
    assert int(answers[2].headers["Retry-After"]) >= 1
