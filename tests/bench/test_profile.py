"""The bench's per-stage profile: every stage of a create and a release is seen, and they fit in the request.

Run on a one-node pool through the real views; no timing thresholds, only
that the profile accounts for the request's time without counting any of it
twice, and that its seams still name the product's functions.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from bench.profile import FRAMEWORK, SEAMS, STAGES, Profiler, profile_run, profiling
from core.authentication import BearerTokenAuthentication
from core.services import token_issue
from inventory.models import Pool
from reservations import services
from tests.support.placement import make_node

pytestmark = pytest.mark.django_db(transaction=True)

SAMPLES = 5

# The stages each operation must pass through: all but those that belong to the other operation.
# (The idempotency look-up is a replay's only: a new create meets no earlier one at its INSERT.)
CREATE_ONLY = ("idempotency", "planning", "commit: charge")
# (A create counts its write in the statement that reads its pool, a release in its last statement:
# "rate limit" is a write that never got there. A release answers from its own statement: "read
# back" is a release of one already ended.)
CREATE_STAGES = tuple(stage for stage in STAGES if stage not in ("read back", "idempotency", "rate limit"))
RELEASE_STAGES = tuple(stage for stage in STAGES if stage not in (*CREATE_ONLY, "read back", "rate limit"))


@pytest.fixture(autouse=True)
def fresh_node_records() -> None:
    """The fake daemon's tables have no model, so a flush between tests leaves them: start empty."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE fake_daemon_assignments, fake_daemon_claims")


@pytest.fixture
def profile(owned_pool: Pool) -> dict[str, Any]:
    make_node(owned_pool, gpus=2)
    _, token = token_issue(tenant_id=owned_pool.owner_id, role="member", name="profile")
    return profile_run(
        token=token, tenant_id=owned_pool.owner_id, pool_id=owned_pool.pk, samples=SAMPLES, warmup=1
    )


@pytest.mark.parametrize(("operation", "expected"), [("create", CREATE_STAGES), ("release", RELEASE_STAGES)])
def test_every_stage_of_the_request_is_measured(
    profile: dict[str, Any], operation: str, expected: tuple[str, ...]
) -> None:
    measured = profile[operation]
    assert profile["samples"] == SAMPLES and measured["n"] == SAMPLES
    assert set(measured["stages"]) == {*STAGES, FRAMEWORK}
    seen = {stage for stage, row in measured["stages"].items() if row["calls"] > 0}
    assert seen >= set(expected)
    # Every statement of the request is counted once, to one stage.
    assert measured["statements"] == pytest.approx(sum(r["statements"] for r in measured["stages"].values()))
    for stage in ("decision", "commit: transaction") if operation == "create" else ("commit: transaction",):
        assert measured["stages"][stage]["statements"] >= 1, stage
    assert measured["stages"]["rate limit"]["calls"] == 0  # counted in a statement the write makes anyway
    # A token used within the last second is remembered (`core.auth_cache`): no statement.
    assert measured["stages"]["authentication"]["statements"] < 1
    assert measured["cpu_p50_ms"] > 0 and measured["probed_cpu_p50_ms"] > 0
    # The test database runs on this machine: its backend's CPU is read from /proc.
    assert measured["db_cpu_mean_ms"] is not None and measured["db_cpu_mean_ms"] >= 0


@pytest.mark.parametrize("operation", ["create", "release"])
def test_the_stages_add_up_to_no_more_than_the_request(profile: dict[str, Any], operation: str) -> None:
    measured = profile[operation]
    # Per request, the stages' own times never sum past the request's time.
    assert measured["stages_over_request_ms"] <= 0
    own = sum(measured["stages"][stage]["mean_ms"] for stage in STAGES)
    # Rounded to the microsecond, stage by stage.
    assert own <= measured["mean_ms"] + 0.001 * len(STAGES)
    assert measured["stages"][FRAMEWORK]["mean_ms"] >= 0


def test_the_profile_puts_every_seam_back(owned_pool: Pool) -> None:
    before = (
        BearerTokenAuthentication.__dict__["authenticate"],
        services._create_once,
        services._release_once,
    )
    with profiling(Profiler()):
        assert services._create_once is not before[1]
    after = (
        BearerTokenAuthentication.__dict__["authenticate"],
        services._create_once,
        services._release_once,
    )
    assert after == before
    assert len({stage for _, _, stage in SEAMS}) == len(STAGES)


def test_an_unprobed_request_passes_every_seam_straight_through(owned_pool: Pool) -> None:
    """The request CPU the targets compare is read on requests that pay nothing for the probes."""
    from django.test import Client

    from bench.load import one_gpu_hour
    from bench.profile import _host

    make_node(owned_pool, gpus=2)
    _, token = token_issue(tenant_id=owned_pool.owner_id, role="member", name="profile")
    client = Client(SERVER_NAME=_host(), HTTP_AUTHORIZATION=f"Bearer {token}")
    profiler = Profiler()
    body = one_gpu_hour(tenant_id=owned_pool.owner_id, pool_id=owned_pool.pk, key="unprobed")
    with profiling(profiler):
        profiler.probing = False
        response = client.post("/api/compute/reservations/create", body, "application/json")
        assert response.status_code == 201, response.content
        unprobed = profiler.reset()
        profiler.probing = True
        body = {**body, "idempotencyKey": "probed"}
        assert client.post("/api/compute/reservations/create", body, "application/json").status_code == 201
        probed = profiler.reset()
    assert unprobed.calls == {} and unprobed.statements == {} and unprobed.cpu == {}
    assert probed.calls["planning"] == 1 and sum(probed.statements.values()) > 0
