"""Guard 6, the node's own word: refuse an assignment that clashes with what the node already holds.

The control plane has its own guards (the exclusion constraint, the guarded
counters); this one checks again on the host, against the node's own record,
so a control plane that is wrong, stale or forged cannot put two reservations
on one GPU or promise more memory than the host has. Pure functions: the
store reads what it holds, calls `refusal` and writes the answer.

A change (as the service delivers it) is a JSON object:
`deliveryId`, `kind` ("assign" or "shorten"), `reservationId`, `start` and
`end` (epoch milliseconds, `[start, end)`), and for an assign `atoms`,
`resources` (scalar claims) and `profile`. Unknown keys are ignored, so the
service can add fields before every agent knows them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

KINDS = ("assign", "shorten")
# A reservation id names its device in the CDI spec, so it must be a valid CDI
# device name: alphanumerics at both ends, `_ - . :` between (the service's
# `rsv_<ulid>` always is).
RESERVATION_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]{0,126}[A-Za-z0-9])?$")
# Times and amounts stay within what JSON readers hold exactly (integers up to 2**53).
MAX_INT = 2**53


class Held(Protocol):
    """What the guard reads of a holding (the store's `Holding` has it), so the guard imports no store."""

    @property
    def reservation_id(self) -> str: ...
    @property
    def atoms(self) -> tuple[str, ...]: ...
    @property
    def start_ms(self) -> int: ...
    @property
    def end_ms(self) -> int: ...
    @property
    def resources(self) -> Mapping[str, int]: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _timestamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def delivery_id_problem(change: object) -> str | None:
    """Why the change carries no usable delivery id (then it cannot even be answered in order)."""
    if not isinstance(change, Mapping):
        return f"a change must be a JSON object, not {type(change).__name__}"
    delivery_id = change.get("deliveryId")
    if not _is_int(delivery_id) or delivery_id == 0:
        return f"deliveryId must be a positive integer, not {delivery_id!r}"
    return None


def claims(change: Mapping[str, Any]) -> Any:
    """The assign's scalar claims as delivered (an object once the shape is checked); null is none."""
    resources = change.get("resources")
    return {} if resources is None else resources


def _assign_problem(change: Mapping[str, Any]) -> str | None:
    atoms = change.get("atoms")
    if not isinstance(atoms, list) or not all(isinstance(atom, str) and atom for atom in atoms):
        return "atoms must be a list of non-empty strings"
    resources = claims(change)
    if not isinstance(resources, Mapping):
        return "resources must be an object of scalar claims"
    for name, amount in resources.items():
        if not isinstance(name, str) or not name or not _is_int(amount):
            return f"resources[{name!r}] must be a non-negative integer, not {amount!r}"
    profile = change.get("profile")
    if profile is not None:
        if not isinstance(profile, Mapping):
            return "profile must be an object or null"
        if not isinstance(profile.get("profileId"), str) or not _is_int(profile.get("profileVersion")):
            return "profile must carry a string profileId and an integer profileVersion"
        try:
            json.dumps(profile)
        except (TypeError, ValueError):
            return "profile must be plain JSON"
    if change["end"] <= change["start"]:
        return f"the window [{change['start']}, {change['end']}) is empty"
    return None


def shape_problem(change: object) -> str | None:
    """Why the change is malformed, or None: what a well-formed change must carry for its kind."""
    problem = delivery_id_problem(change)
    if problem is not None:
        return problem
    assert isinstance(change, Mapping)
    kind = change.get("kind")
    if kind not in KINDS:
        return f"kind must be one of {', '.join(KINDS)}, not {kind!r}"
    reservation_id = change.get("reservationId")
    if not isinstance(reservation_id, str) or not RESERVATION_ID.match(reservation_id):
        return f"reservationId {reservation_id!r} is not a valid reservation id"
    # A shorten names only its new end; the node keeps the start it was assigned.
    for key in ("start", "end") if kind == "assign" else ("end",):
        if not _is_int(change.get(key)):
            return f"{key} must be epoch milliseconds (a non-negative integer), not {change.get(key)!r}"
    if "start" in change and not _is_int(change["start"]):
        return f"start must be epoch milliseconds (a non-negative integer), not {change['start']!r}"
    if kind == "assign":
        return _assign_problem(change)
    return None


def _atom_clash(atoms: Iterable[str], others: list[Held]) -> str | None:
    for atom in atoms:
        for other in sorted(others, key=lambda held: (held.start_ms, held.reservation_id)):
            if atom in other.atoms:
                return (
                    f"atom {atom} is held by {other.reservation_id} from {_timestamp(other.start_ms)}"
                    f" until {_timestamp(other.end_ms)}"
                )
    return None


def _scalar_excess(
    name: str, amount: int, start: int, end: int, others: list[Held], capacity: Mapping[str, int]
) -> str | None:
    """The first instant of `[start, end)` at which `amount` more of `name` would exceed capacity."""
    has = int(capacity.get(name, 0))
    claiming = [held for held in others if held.resources.get(name, 0) > 0]
    # What is claimed only changes where a holding starts, so those instants (and
    # the window's own start) are the only ones worth checking.
    instants = sorted({start, *(held.start_ms for held in claiming if start < held.start_ms < end)})
    for instant in instants:
        live = [held for held in claiming if held.start_ms <= instant < held.end_ms]
        claimed = sum(held.resources[name] for held in live)
        if claimed + amount > has:
            if not live:
                return f"{name}: {amount} asked, the node has {has}"
            holders = ", ".join(sorted({held.reservation_id for held in live}))
            return (
                f"{name}: {amount} asked, {claimed} of {has} already claimed at {_timestamp(instant)}"
                f" by {holders}"
            )
    return None


def refusal(change: Mapping[str, Any], held: Iterable[Held], capacity: Mapping[str, int]) -> str | None:
    """Why the node refuses the change, or None to accept it.

    `held` is what the node holds (all of it, or at least every holding that
    overlaps the change's window); the change's own reservation is left out, as
    a redelivered assign replaces that reservation's record. A shorten only
    gives back and is never refused once well formed. A scalar the node did not
    report (absent from `capacity`) has none to give.
    """
    problem = shape_problem(change)
    if problem is not None or change["kind"] != "assign":
        return problem
    start, end = int(change["start"]), int(change["end"])
    others = [
        holding
        for holding in held
        if holding.reservation_id != change["reservationId"]
        and holding.start_ms < end
        and start < holding.end_ms
    ]
    clash = _atom_clash(change["atoms"], others)
    if clash is not None:
        return clash
    for name, amount in sorted(claims(change).items()):
        if amount > 0:
            excess = _scalar_excess(name, int(amount), start, end, others, capacity)
            if excess is not None:
                return excess
    return None
