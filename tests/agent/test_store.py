"""The node's record and guard 6 as the node enforces it: what it accepts, refuses, and remembers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from better_compute_agent.guard import refusal
from better_compute_agent.store import FORMAT_VERSION, Answer, Holding, Store

HOUR = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CAPACITY = {"vcpu": 64, "memoryGiB": 512, "hugepages1Gi": 8}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "state" / "agent.json") as opened:
        yield opened


def assign(
    delivery_id: int,
    reservation_id: str,
    atoms: list[str],
    start: int,
    end: int,
    resources: dict[str, int] | None = None,
    profile: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "deliveryId": delivery_id,
        "kind": "assign",
        "reservationId": reservation_id,
        "atoms": atoms,
        "start": start,
        "end": end,
        "resources": resources or {},
        "profile": profile,
    }


def shorten(delivery_id: int, reservation_id: str, end: int) -> dict[str, Any]:
    return {"deliveryId": delivery_id, "kind": "shorten", "reservationId": reservation_id, "end": end}


def test_an_overlapping_atom_is_refused_naming_the_other_reservation(store: Store) -> None:
    assert store.apply(assign(1, "rsv_a", ["GPU-1", "GPU-2"], T0, T0 + 2 * HOUR), capacity=CAPACITY).accepted

    answer = store.apply(assign(2, "rsv_b", ["GPU-3", "GPU-2"], T0 + HOUR, T0 + 3 * HOUR), capacity=CAPACITY)

    assert answer == Answer(
        delivery_id=2,
        accepted=False,
        reason="atom GPU-2 is held by rsv_a from 2026-01-01T00:00:00.000Z until 2026-01-01T02:00:00.000Z",
    )
    assert store.holding("rsv_b") is None
    assert [held.reservation_id for held in store.holdings()] == ["rsv_a"]


def test_the_same_reservation_assigned_again_replaces_its_record(store: Store) -> None:
    store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + 2 * HOUR, {"vcpu": 40}), capacity=CAPACITY)

    # Its own atoms and its own 40 vCPUs never stand in its way.
    answer = store.apply(
        assign(
            2,
            "rsv_a",
            ["GPU-1", "GPU-2"],
            T0,
            T0 + 4 * HOUR,
            {"vcpu": 60},
            {"profileId": "p", "profileVersion": 3},
        ),
        capacity=CAPACITY,
    )

    assert answer.accepted
    assert store.holdings() == [
        Holding(
            reservation_id="rsv_a",
            atoms=("GPU-1", "GPU-2"),
            start_ms=T0,
            end_ms=T0 + 4 * HOUR,
            resources={"vcpu": 60},
            profile={"profileId": "p", "profileVersion": 3},
            delivery_id=2,
        )
    ]


def test_adjacent_windows_on_one_atom_are_both_accepted(store: Store) -> None:
    first = store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR, {"vcpu": 64}), capacity=CAPACITY)
    second = store.apply(
        assign(2, "rsv_b", ["GPU-1"], T0 + HOUR, T0 + 2 * HOUR, {"vcpu": 64}), capacity=CAPACITY
    )

    assert first.accepted and second.accepted
    assert [held.reservation_id for held in store.holdings(at_ms=T0 + HOUR)] == ["rsv_b"]
    assert [held.reservation_id for held in store.holdings(at_ms=T0 + HOUR - 1)] == ["rsv_a"]


def test_scalars_are_refused_only_where_the_claims_overlap_beyond_capacity(store: Store) -> None:
    def claim(delivery_id: int, reservation_id: str, start_h: int, end_h: int, vcpu: int) -> Answer:
        change = assign(
            delivery_id, reservation_id, [], T0 + start_h * HOUR, T0 + end_h * HOUR, {"vcpu": vcpu}
        )
        return store.apply(change, capacity=CAPACITY)

    # 40 of 64 vCPUs over [0h, 2h) and 40 over [2h, 4h): they never meet, so both fit,
    # and 24 more over [1h, 3h) fit beside either at every instant.
    assert claim(1, "rsv_a", 0, 2, 40).accepted
    assert claim(2, "rsv_b", 2, 4, 40).accepted
    assert claim(3, "rsv_c", 1, 3, 24).accepted
    # One more over [0h, 3h) fits at 0h and not from 1h on, where rsv_a and rsv_c hold all 64.
    assert claim(4, "rsv_d", 0, 3, 1).reason == (
        "vcpu: 1 asked, 64 of 64 already claimed at 2026-01-01T01:00:00.000Z by rsv_a, rsv_c"
    )
    # Where only one of them runs, 24 still fit.
    assert claim(5, "rsv_e", 0, 1, 24).accepted
    assert claim(6, "rsv_f", 3, 4, 24).accepted
    assert claim(7, "rsv_g", 2, 3, 1).reason == (
        "vcpu: 1 asked, 64 of 64 already claimed at 2026-01-01T02:00:00.000Z by rsv_b, rsv_c"
    )
    assert [held.reservation_id for held in store.holdings()] == ["rsv_a", "rsv_e", "rsv_c", "rsv_b", "rsv_f"]


def test_an_assign_without_resources_or_profile_claims_no_scalars(store: Store) -> None:
    change = assign(1, "rsv_a", ["GPU-1", "GPU-1"], T0, T0 + HOUR)
    del change["profile"]
    change["resources"] = None

    assert store.apply(change, capacity={}).accepted
    held = store.holding("rsv_a")
    assert held is not None and (held.atoms, held.resources, held.profile) == (("GPU-1",), {}, None)


def test_a_scalar_the_node_has_not_reported_cannot_be_claimed(store: Store) -> None:
    answer = store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR, {"nvmeGiB": 10}), capacity=CAPACITY)

    assert answer.reason == "nvmeGiB: 10 asked, the node has 0"


def test_a_shorten_is_accepted_and_frees_the_atom_for_a_later_assign(store: Store) -> None:
    store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + 4 * HOUR), capacity=CAPACITY)

    cut = store.apply(shorten(2, "rsv_a", T0 + HOUR), capacity=CAPACITY)
    after = store.apply(assign(3, "rsv_b", ["GPU-1"], T0 + HOUR, T0 + 4 * HOUR), capacity=CAPACITY)
    before = store.apply(assign(4, "rsv_c", ["GPU-1"], T0, T0 + 2 * HOUR), capacity=CAPACITY)

    assert cut == Answer(delivery_id=2, accepted=True, reason=None)
    assert after.accepted
    assert before.reason is not None and "held by rsv_a" in before.reason
    held = store.holding("rsv_a")
    assert held is not None and (held.end_ms, held.delivery_id) == (T0 + HOUR, 2)


def test_a_shorten_to_the_start_removes_the_holding_and_never_extends_one(store: Store) -> None:
    store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)
    store.apply(assign(2, "rsv_b", ["GPU-2"], T0, T0 + HOUR), capacity=CAPACITY)

    gone = store.apply(shorten(3, "rsv_a", T0), capacity=CAPACITY)
    longer = store.apply(shorten(4, "rsv_b", T0 + 5 * HOUR), capacity=CAPACITY)
    unknown = store.apply(shorten(5, "rsv_never", T0), capacity=CAPACITY)

    assert gone.accepted and longer.accepted and unknown.accepted
    assert store.holding("rsv_a") is None
    held = store.holding("rsv_b")
    assert held is not None and held.end_ms == T0 + HOUR


def test_an_old_delivery_gets_the_same_answer_and_changes_nothing(store: Store) -> None:
    store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)
    refused = store.apply(assign(2, "rsv_b", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)
    store.apply(shorten(3, "rsv_a", T0), capacity=CAPACITY)
    before = store.holdings()

    # rsv_b's atom is free now, yet its delivery is answered as it was the first time.
    assert store.apply(assign(2, "rsv_b", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY) == refused
    # And rsv_a's assign, delivered again, does not bring back what the shorten gave up.
    assert store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY).accepted
    assert store.holdings() == before == []
    assert store.last_delivery_id() == 3


def test_an_unseen_delivery_older_than_the_last_is_refused_not_applied(store: Store) -> None:
    store.apply(assign(5, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)

    late = store.apply(assign(4, "rsv_b", ["GPU-2"], T0, T0 + HOUR), capacity=CAPACITY)

    assert late == Answer(4, False, "delivery 4 arrived after delivery 5; changes apply in order only")
    assert store.holding("rsv_b") is None
    assert store.apply(assign(4, "rsv_b", ["GPU-2"], T0, T0 + HOUR), capacity=CAPACITY) == late
    assert store.last_delivery_id() == 5


def test_a_new_store_on_the_same_file_sees_the_holdings_and_the_unacked_answers(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    with Store(path) as first:
        assert first.last_delivery_id() == 0
        first.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR, {"vcpu": 8}), capacity=CAPACITY)
        first.apply(assign(2, "rsv_b", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)
        first.apply(assign(3, "rsv_c", ["GPU-2"], T0, T0 + HOUR), capacity=CAPACITY)
        first.mark_acked(1)
        holdings = first.holdings()

    with Store(path) as second:
        assert second.holdings() == holdings
        assert [held.reservation_id for held in holdings] == ["rsv_a", "rsv_c"]
        assert [(answer.delivery_id, answer.accepted) for answer in second.unacked()] == [
            (2, False),
            (3, True),
        ]
        assert second.last_delivery_id() == 3
        second.mark_acked(2)
        second.mark_acked(3)
        assert second.unacked() == []
        # Still guarded by what the first one accepted.
        assert not second.apply(assign(4, "rsv_d", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY).accepted

    # One plain document, replaced whole by each write: no temporary file is left beside it.
    assert json.loads(path.read_text())["version"] == FORMAT_VERSION
    assert not path.with_name(path.name + ".tmp").exists()


def test_a_change_and_its_answer_commit_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent.json"
    store = Store(path)

    def crash(*_args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(Store, "_record", staticmethod(crash))
    with pytest.raises(OSError, match="disk gone"):
        store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)
    monkeypatch.undo()

    assert store.holdings() == [] and store.last_delivery_id() == 0
    # Delivered again after the failure, it is applied as new.
    assert store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY).accepted
    store.close()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("assign", "a change must be a JSON object, not str"),
        ({"kind": "assign"}, "deliveryId must be a positive integer, not None"),
        (
            {**assign(1, "rsv_a", [], T0, T0 + 1), "deliveryId": True},
            "deliveryId must be a positive integer, not True",
        ),
        (
            {**assign(1, "rsv_a", [], T0, T0 + 1), "kind": "grow"},
            "kind must be one of assign, shorten, not 'grow'",
        ),
        ({**assign(1, "rsv a", [], T0, T0 + 1)}, "reservationId 'rsv a' is not a valid reservation id"),
        (assign(1, "rsv_a", "GPU-1", T0, T0 + 1), "atoms must be a list of non-empty strings"),  # type: ignore[arg-type]
        (assign(1, "rsv_a", ["GPU-1"], T0, T0), f"the window [{T0}, {T0}) is empty"),
        (
            {**assign(1, "rsv_a", [], T0, T0 + 1), "start": "now"},
            "start must be epoch milliseconds (a non-negative integer), not 'now'",
        ),
        (
            assign(1, "rsv_a", [], T0, T0 + 1, {"vcpu": -2}),
            "resources['vcpu'] must be a non-negative integer, not -2",
        ),
        (
            assign(1, "rsv_a", [], T0, T0 + 1, profile={"profileId": 7}),
            "profile must carry a string profileId and an integer profileVersion",
        ),
        (
            {"deliveryId": 1, "kind": "shorten", "reservationId": "rsv_a"},
            "end must be epoch milliseconds (a non-negative integer), not None",
        ),
    ],
)
def test_a_malformed_change_is_refused_with_a_reason_not_raised(
    store: Store, change: Any, reason: str
) -> None:
    answer = store.apply(change, capacity=CAPACITY)

    assert (answer.accepted, answer.reason) == (False, reason)
    assert store.holdings() == []


def test_a_malformed_change_with_a_delivery_id_is_answered_in_order(store: Store) -> None:
    answer = store.apply({**assign(7, "rsv_a", ["GPU-1"], T0, T0 + HOUR), "atoms": None}, capacity=CAPACITY)

    assert answer.delivery_id == 7
    assert store.unacked() == [answer] and store.last_delivery_id() == 7


def test_prune_drops_holdings_that_are_over(store: Store) -> None:
    store.apply(assign(1, "rsv_a", ["GPU-1"], T0, T0 + HOUR), capacity=CAPACITY)
    store.apply(assign(2, "rsv_b", ["GPU-1"], T0 + HOUR, T0 + 2 * HOUR), capacity=CAPACITY)
    store.mark_acked(1)
    store.mark_acked(2)

    assert store.prune(before_ms=T0 + HOUR) == 1
    assert [held.reservation_id for held in store.holdings()] == ["rsv_b"]
    # The last answer stays, so the agent still asks for what comes after it.
    store.prune(before_ms=2**53)
    assert store.last_delivery_id() == 2


def test_the_guard_ignores_holdings_outside_the_window_and_the_reservation_itself() -> None:
    held = [
        Holding("rsv_a", ("GPU-1",), T0, T0 + HOUR, {"vcpu": 64}, None, 1),
        Holding("rsv_b", ("GPU-2",), T0, T0 + HOUR, {"vcpu": 64}, None, 2),
    ]
    change = assign(3, "rsv_b", ["GPU-2"], T0, T0 + HOUR, {"vcpu": 1})

    # rsv_b's own 64 are replaced by the new claim, not added to it.
    assert refusal(change, held, {"vcpu": 65}) is None
    assert refusal({**change, "start": T0 + HOUR, "end": T0 + 2 * HOUR}, held, {"vcpu": 1}) is None
    assert refusal(change, held, {"vcpu": 64}) == (
        "vcpu: 1 asked, 64 of 64 already claimed at 2026-01-01T00:00:00.000Z by rsv_a"
    )


def test_the_guard_lets_windows_touch_on_either_side() -> None:
    held = [
        Holding("rsv_before", ("GPU-1",), T0 - HOUR, T0, {"vcpu": 64}, None, 1),
        Holding("rsv_after", ("GPU-1",), T0 + HOUR, T0 + 2 * HOUR, {"vcpu": 64}, None, 2),
    ]

    assert refusal(assign(3, "rsv_b", ["GPU-1"], T0, T0 + HOUR, {"vcpu": 64}), held, {"vcpu": 64}) is None
    assert refusal(assign(3, "rsv_b", ["GPU-1"], T0, T0 + HOUR + 1), held, {}) == (
        "atom GPU-1 is held by rsv_after from 2026-01-01T01:00:00.000Z until 2026-01-01T02:00:00.000Z"
    )
