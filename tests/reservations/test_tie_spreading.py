"""Ties spread between concurrent plans: equally good options come in a per-plan random order.

Every plan of one request shape in one pool used to rank equal scores by
node id, so concurrent creates all tried the same node (and the same atoms)
first and all but one lost the race. Now each plan draws a salt: equal
scores, equal NUMA groups and equal atoms are ordered by it, while a better
score still always comes first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inventory.models import Pool
from reservations.models import DeviceBooking
from reservations.placer import option as placer_option
from reservations.placer import plan as plan_module
from reservations.placer.plan import Plan, placement_plan, placement_window
from reservations.request.types import ReservationRequest
from reservations.services import reservation_create
from tests.conftest import ClientFor
from tests.support.api import post, reservation_body
from tests.support.placement import gpu_request, make_node
from tests.support.threads import JOIN_SECONDS, Worker, workers_race

SALTS = [index * 7_919 for index in range(24)]
# 16 clients in one pool, each booking one GPU at once (the lost-race target).
CLIENTS = 16


def plan_for(request: ReservationRequest, salt: int | None = None) -> Plan:
    pool = Pool.objects.get(pk=request.pool_id)
    return placement_plan(request=request, pool=pool, window=placement_window(request=request), salt=salt)


def first_nodes(plan: Plan) -> tuple[str, ...]:
    return tuple(member.node_id for member in plan.options[0].members)


@pytest.mark.django_db
def test_equal_scores_are_tried_in_an_order_that_varies_between_plans(owned_pool: Pool) -> None:
    nodes = {make_node(owned_pool, gpus=8).id for _ in range(6)}
    request = gpu_request(owned_pool, 1)
    # Fresh salts: the best option is not always the same node, and any of them can come first.
    firsts = {first_nodes(plan_for(request, salt))[0] for salt in SALTS}
    assert len(firsts) > 1 and firsts <= nodes
    # A plan without a salt draws its own: twenty-four plans do not all agree either.
    assert len({first_nodes(plan_for(request))[0] for _ in SALTS}) > 1
    # One salt is one order: a plan is reproducible from its salt, atoms included.
    again = plan_for(request, SALTS[0])
    assert again.options == plan_for(request, SALTS[0]).options


@pytest.mark.django_db
def test_a_better_score_still_comes_first_whatever_the_salt(owned_pool: Pool) -> None:
    for _ in range(4):
        make_node(owned_pool, gpus=8)
    # Four GPUs on one NUMA node: for a 4-GPU request it scores best on bin packing.
    snug = make_node(owned_pool, gpus=4, numa_split=4)
    request = gpu_request(owned_pool, 4)
    for salt in SALTS:
        plan = plan_for(request, salt)
        assert first_nodes(plan) == (snug.id,)
        scores = [option.score for option in plan.options]
        assert scores == sorted(scores, reverse=True)
        assert plan.options[0].score > plan.options[1].score
        # The NUMA preference holds too: the four atoms of each 8-GPU node share one NUMA node.
        for option in plan.options[1:]:
            numa = {atom.rsplit("-", 1)[1] < "4" for atom in option.members[0].atoms}
            assert len(numa) == 1


@pytest.mark.django_db
def test_two_plans_on_one_node_usually_pick_different_atoms(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=8)
    request = gpu_request(owned_pool, 1)
    atoms = {plan_for(request, salt).options[0].members[0].atoms for salt in SALTS}
    assert len(atoms) > 2


@pytest.mark.django_db
def test_gang_groups_and_their_members_spread_too(owned_pool: Pool) -> None:
    fabrics = {}
    for fabric in ("f-a", "f-b", "f-c"):
        fabrics[fabric] = {make_node(owned_pool, gpus=8, labels={"fabric": fabric}).id for _ in range(3)}
    request = gpu_request(owned_pool, 8, gang_size=2)
    gangs = {first_nodes(plan_for(request, salt)) for salt in SALTS}
    # Every gang is two nodes of one fabric; neither the fabric nor the pair is always the same.
    for gang in gangs:
        assert len(set(gang)) == 2 and any(set(gang) <= members for members in fabrics.values())
    assert len({next(f for f, members in fabrics.items() if gang[0] in members) for gang in gangs}) > 1
    assert len({frozenset(gang) for gang in gangs}) > 3


class LostRaces(logging.Handler):
    """Counts the placer's lost races and replans, as operators (and the benchmark) read them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lost = 0
        self.replans = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.lost += message.startswith("placement lost a race")
        self.replans += message.startswith("placement replan")


@pytest.fixture
def lost_races() -> Iterator[LostRaces]:
    logger = logging.getLogger("reservations.placer")  # the options' lost races and the commit's replans
    handler, level = LostRaces(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_creates_in_one_pool_rarely_collide(
    owned_pool: Pool, api_client_for: ClientFor, lost_races: LostRaces
) -> None:
    for _ in range(16):
        make_node(owned_pool, gpus=8)
    # A client (and token) per thread: the test client keeps state between calls.
    clients = [api_client_for("acme", "member") for _ in range(CLIENTS)]

    def creating(index: int) -> Callable[[], Any]:
        def run() -> Any:
            body = reservation_body(owned_pool, "acme", f"tie-{index}", gpus=1)
            return post(clients[index], "reservations/create", body).status_code

        return run

    workers = workers_race([creating(index) for index in range(CLIENTS)])
    for worker in workers:
        worker.join_ok()
    assert [worker.result for worker in workers] == [201] * CLIENTS
    # When every plan tried the lowest node id (and its lowest atom) first, these 16 creates lost
    # 58 to 105 races and replanned 1 to 5 times; spread, most runs lose 0 to 3. What remains is
    # bin packing's own doing: once one create lands, its node is the single best for the rest.
    # (Replans are not asserted: the odd one under a loaded machine says nothing about ties.)
    assert lost_races.lost < CLIENTS, (lost_races.lost, lost_races.replans)


@pytest.mark.django_db(transaction=True)
def test_a_one_atom_placement_takes_another_free_atom_when_a_concurrent_one_holds_the_planned_one(
    owned_pool: Pool, lost_races: LostRaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(owned_pool, gpus=2, numa_split=2)
    # One salt for every plan: both plans rank the same node and the same atom first.
    monkeypatch.setattr(plan_module, "tie_salt", lambda: SALTS[1])
    reached, go_on = threading.Event(), threading.Event()

    def hold_the_first(point: str, node_id: str) -> None:
        if point == "after_locks" and not reached.is_set():
            reached.set()
            assert go_on.wait(JOIN_SECONDS)

    placer_option.HOOKS.append(hold_the_first)
    try:
        first = Worker(lambda: reservation_create(request=gpu_request(owned_pool, 1), actor="test"))
        first.start()
        assert reached.wait(JOIN_SECONDS)
        # The first holds its atom, uncommitted; the second planned the same atom, passes over
        # it at the lock (it does not wait for the first to commit) and books the other one.
        second = reservation_create(request=gpu_request(owned_pool, 1), actor="test")
        go_on.set()
        first_result = first.finish()
    finally:
        go_on.set()
        placer_option.HOOKS.remove(hold_the_first)
    assert first.error is None, first.error
    ids = [created.reservation.id for created in (first_result, second)]
    bookings = DeviceBooking.objects.filter(allocation__reservation_id__in=ids)
    taken = set(bookings.values_list("device__uid", flat=True))
    assert taken == {f"GPU-{node.hostname}-0", f"GPU-{node.hostname}-1"}
    assert lost_races.lost == 0
