"""A plan's options are built when asked for: a create that books its first option builds only that one.

The shortlist holds up to ten nodes; choosing each one's atoms is Python's
share of a plan. A create takes the first option that holds, so the rest are
built only if it goes on to them; a preview that lists every option builds
them all, and sees the same options an eager plan would have made.
"""

from __future__ import annotations

from typing import Any

import pytest

from inventory.models import Pool
from reservations.placer import plan as plan_module
from reservations.placer.plan import Member, Option, Options, placement_plan, placement_window
from reservations.request.types import ReservationRequest
from reservations.services import reservation_create
from tests.support.placement import gpu_request, make_node


def option(node_id: str) -> Option:
    member = Member(node_id=node_id, device_ids=(1,), atoms=("GPU-1",), classes=("gpu",), score=1.0)
    return Option(members=(member,), score=1.0)


def test_options_are_pulled_one_at_a_time_and_kept() -> None:
    pulled: list[str] = []

    def source() -> Any:
        for node_id in ("a", "b", "c"):
            pulled.append(node_id)
            yield option(node_id)

    options = Options(source())
    assert pulled == []
    assert options and pulled == ["a"]
    assert options[0].members[0].node_id == "a" and pulled == ["a"]
    first = next(iter(options))
    assert first is options[0] and pulled == ["a"]
    assert options[1].members[0].node_id == "b" and pulled == ["a", "b"]
    # Everything at once, in order, each option built once.
    assert [o.members[0].node_id for o in options] == ["a", "b", "c"] and pulled == ["a", "b", "c"]
    assert len(options) == 3 and options == [option("a"), option("b"), option("c")]
    assert options[-1] == option("c") and options[1:] == [option("b"), option("c")]
    assert not Options()


def calls_of(monkeypatch: pytest.MonkeyPatch, name: str, keyword: str) -> list[Any]:
    """What each call of `plan.<name>` was given as `keyword`, in order."""
    seen: list[Any] = []
    original = getattr(plan_module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs[keyword])
        return original(*args, **kwargs)

    monkeypatch.setattr(plan_module, name, counted)
    return seen


def count_members(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return calls_of(monkeypatch, "member_choose", "node_id")


def plan_of(request: ReservationRequest, salt: int = 1) -> plan_module.Plan:
    pool = Pool.objects.get(pk=request.pool_id)
    return placement_plan(request=request, pool=pool, window=placement_window(request=request), salt=salt)


@pytest.mark.django_db
def test_a_create_that_books_its_first_option_builds_only_that_one(
    owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(5):
        make_node(owned_pool, gpus=8)
    built = count_members(monkeypatch)
    reservation, created = reservation_create(request=gpu_request(owned_pool, 2), actor="test")
    assert created
    assert built == [reservation.allocations.get().node_id]


@pytest.mark.django_db
def test_listing_the_options_builds_them_all_as_an_eager_plan_would(
    owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = {make_node(owned_pool, gpus=8).pk for _ in range(5)}
    request = gpu_request(owned_pool, 2)
    built = count_members(monkeypatch)
    plan = plan_of(request)
    listed = list(plan.options)
    assert len(built) == len(listed) == len(nodes)
    assert {o.members[0].node_id for o in listed} == nodes
    # The same salt is the same plan, atoms and order, however it is read.
    assert plan_of(request).options == listed


@pytest.mark.django_db
def test_options_past_those_read_with_the_ranking_are_read_when_asked_for_and_are_the_same(
    owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A create reads the first options' atoms with the ranking and the others only if
    # it gets to them (a lost race), in one more statement: the same options either way.
    for _ in range(6):
        make_node(owned_pool, gpus=8)
    request = gpu_request(owned_pool, 2)
    pool = Pool.objects.get(pk=request.pool_id)
    window = placement_window(request=request)
    read_later = calls_of(monkeypatch, "_atoms_for", "node_ids")
    lazy = placement_plan(request=request, pool=pool, window=window, salt=7, atoms_with_ranking=2)
    assert lazy.scope == "counts"
    first_two = [lazy.options[0], lazy.options[1]]
    assert read_later == []
    everything = list(lazy.options)
    assert len(everything) == 6
    # The four others, read together once, the first time one of them was asked for.
    assert len(read_later) == 1 and sorted(read_later[0]) == sorted(
        o.members[0].node_id for o in everything[2:]
    )
    eager = placement_plan(request=request, pool=pool, window=window, salt=7, atoms_with_ranking=10)
    assert list(eager.options) == everything and everything[:2] == first_two
    assert len(read_later) == 1  # the eager plan read every node's atoms with its ranking
