"""Planning: the ranked shortlist of placement options for a request. Reads only, writes nothing.

An option is one node (a plain request) or `gang.size` nodes sharing one
value of the gang's topology label. Each member names the atoms it would
book. `capacity.preview` shows a plan; `commit.placement_commit` walks one.

Equal scores (and equally good atoms on a node) are ordered by a salt drawn
per plan, so concurrent plans of one request shape in one pool spread over
the equally good nodes instead of colliding on the lowest node id; a preview
may therefore name a different one of them than the create then books.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

from django.db import connection

from core.clock import compute_now
from core.errors import InvalidInput
from inventory.models import Pool
from reservations.maintenance.windows import windows_refusal_phrase
from reservations.placer.filters import (
    PlanQuery,
    Window,
    atoms_of_nodes_sql,
    candidates_sql,
    features_sql,
    gang_key,
    row_dicts,
    sharing_mismatch,
    whole_node_atoms_sql,
    with_clause,
)
from reservations.placer.members import Member, member_choose
from reservations.placer.scorers import score_sql
from reservations.placer.sql import Params
from reservations.request.types import ReservationRequest, start_horizon_message, start_horizon_seconds

SHORTLIST_SIZE = 10
# How many nodes (plain requests) or label groups (gangs) the kept counts hand
# the ranking query of a plan starting now; the rest of the pool is ranked only
# when none of them fits.
CANDIDATE_NODES = 2 * SHORTLIST_SIZE
CANDIDATE_GROUPS = SHORTLIST_SIZE
# How many of a plan's first options (plain requests ranked from the kept counts)
# have their atoms read with the ranking; the rest are read, in one more statement,
# only when a commit gets past these. A create books its first option but for a
# lost race; a preview lists all ten and asks for them all at once.
ATOMS_WITH_RANKING = 3


def tie_salt() -> int:
    """A fresh salt for one plan's tie-break: concurrent plans then order equal scores differently."""
    return secrets.randbelow(2**63)


def _tie_sql(column: str, salt: str) -> str:
    """An order among equal scores that is random per salt and fixed within one query (a seeded hash)."""
    return f"hashtextextended({column}, {salt}), {column}"


# A start this far in the past is refused; closer than that it means "now".
START_PAST_TOLERANCE = timedelta(minutes=5)


@dataclass(frozen=True)
class Option:
    members: tuple[Member, ...]
    score: float


class Options(Sequence[Option]):
    """A plan's options, best first, each built the first time it is asked for.

    A create books the first option that holds and seldom looks at a second,
    so choosing the atoms of all ten (Python's share of a plan) for every
    create is work thrown away; a preview that lists them all builds them all.
    Built once, an option is kept: every reader sees the same options.
    """

    def __init__(self, source: Iterable[Option] = ()) -> None:
        self._made: list[Option] = []
        self._source: Iterator[Option] | None = iter(source)

    def _more(self) -> bool:
        if self._source is None:
            return False
        for option in self._source:
            self._made.append(option)
            return True
        self._source = None
        return False

    def _all(self) -> list[Option]:
        while self._more():
            pass
        return self._made

    def __iter__(self) -> Iterator[Option]:
        index = 0
        while index < len(self._made) or self._more():
            yield self._made[index]
            index += 1

    def __bool__(self) -> bool:
        return bool(self._made) or self._more()

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, index: int) -> Option: ...
    @overload
    def __getitem__(self, index: slice) -> list[Option]: ...
    def __getitem__(self, index: int | slice) -> Option | list[Option]:
        if isinstance(index, slice) or index < 0:
            return self._all()[index]
        while len(self._made) <= index and self._more():
            pass
        return self._made[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Options({self._all()!r})"


@dataclass(frozen=True)
class Reason:
    code: str
    message: str


@dataclass
class Plan:
    """A ranked shortlist for one window; `displace` means taking it cuts spot bookings."""

    window: Window
    options: Options = field(default_factory=Options)
    reason: Reason | None = None
    displace: bool = False
    # What was ranked: "counts" (the candidates the kept counts named) or "pool".
    scope: str = "pool"

    @property
    def fits(self) -> bool:
        return bool(self.options)


def placement_window(*, request: ReservationRequest, now: datetime | None = None) -> Window:
    """`[start, start + duration)` by the database clock; a start a little in the past means now.

    The start must lie within the horizon (`CAPACITY_MAX_START_AHEAD`), as the
    request's parser already checked for API bodies; callers that build the
    request themselves (the services, scripts) are held to it here.
    """
    now = now or compute_now()
    start = now
    if request.start_ms is not None:
        asked = datetime.fromtimestamp(request.start_ms / 1000, tz=now.tzinfo)
        if asked < now - START_PAST_TOLERANCE:
            raise InvalidInput.field("start", "must not be more than 5 minutes in the past")
        horizon = start_horizon_seconds()
        if asked > now + timedelta(seconds=horizon):
            raise InvalidInput.field("start", start_horizon_message(horizon))
        start = max(asked, now)
    return Window(start=start, end=start + timedelta(seconds=request.duration_seconds), now=now)


def displaced_window(*, window: Window, notice_seconds: int) -> Window:
    """A displacing request starts when the spot notice ends (or later if it asked to)."""
    start = max(window.start, window.now + timedelta(seconds=notice_seconds))
    return Window(start=start, end=start + (window.end - window.start), now=window.now)


def placement_plan(
    *,
    request: ReservationRequest,
    pool: Pool,
    window: Window,
    displace: bool = False,
    exclude_node_ids: tuple[str, ...] = (),
    limit: int = SHORTLIST_SIZE,
    salt: int | None = None,
    atoms_with_ranking: int = ATOMS_WITH_RANKING,
) -> Plan:
    """The best `limit` options for `request` in `window`, best first; a reason when there are none.

    Options of equal score come in an order drawn from `salt` (fresh per plan
    unless given), so concurrent plans for the same shape in one pool try
    different nodes first instead of all racing for the lowest node id; a
    better score always comes first.

    A request starting now is ranked among the candidates the kept per-node
    counts name (`filters.candidates_sql`: a bounded number of the fullest
    nodes that still hold it, read from an index), so its cost does not grow
    with the pool; only when none of them fits is the whole pool ranked.
    The first `atoms_with_ranking` of those candidates' options have their
    atoms read in the ranking's statement (`ATOMS_WITH_RANKING`).
    """
    if displace:
        window = displaced_window(window=window, notice_seconds=pool.notice_seconds)
    plan = Plan(window=window, displace=displace)
    if pool.archived_at is not None:
        plan.reason = Reason("POOL_ARCHIVED", "the pool is archived")
        return plan
    mismatch = sharing_mismatch(request=request, pool_sharing=pool.sharing)
    if mismatch:
        plan.reason = Reason("SHARING_MISMATCH", mismatch)
        return plan

    salt = tie_salt() if salt is None else salt
    query = PlanQuery(request=request, window=window, displace=displace, exclude_node_ids=exclude_node_ids)
    for scope in ("counts", "pool") if _from_counts(query) else ("pool",):
        # The candidates may hold nothing that fits (a selector they miss, counts
        # a moment behind the clock): then the whole pool is ranked.
        plan.scope = scope
        ranked = _ranked(
            query,
            limit=limit,
            salt=salt,
            from_counts=scope == "counts",
            atoms_with_ranking=atoms_with_ranking,
        )
        plan.options = _options(query, ranked=ranked, salt=salt)
        if plan.options:
            return plan
    reason = _no_fit_reason(request=request, displace=displace)
    # Only on a refusal: windows holding nodes of the pool during the request's window are named.
    held = windows_refusal_phrase(pool_id=request.pool_id, start=window.start, end=window.end)
    plan.reason = Reason(reason.code, reason.message + held) if held else reason
    return plan


def _options(query: PlanQuery, *, ranked: list[dict[str, Any]], salt: int) -> Options:
    """The ranked nodes (or groups) as options, each member with the atoms it would book.

    The atoms are read here, at once (in the plan's snapshot), or came with
    the ranking; an option's members are chosen from them when the option is
    first asked for. Ranked nodes whose atoms did not come with the ranking
    (past its first `atoms_with_ranking`) are read together the first time
    one of them is asked for.
    """
    if not ranked:
        return Options()
    request = query.request
    if request.gang_size:
        groups = [(list(r["nodes"]), list(r["scores"]), float(r["score"])) for r in ranked]
    else:
        groups = [([r["node_id"]], [r["score"]], float(r["score"])) for r in ranked]
    atoms_by_node: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    # The shortlist's atoms, fetched with it as JSON text: read only for the options asked for,
    # and a plan seldom gets past its first (decoding all ten was 0.1 ms of a create's CPU).
    atoms_text: dict[str, str | None] = {}
    unread: set[str] = set()
    if "atoms" in ranked[0]:
        atoms_text = {r["node_id"]: r["atoms"] for r in ranked if r["atoms_read"]}
        unread = {r["node_id"] for r in ranked if not r["atoms_read"]}
    else:
        atoms_by_node = _atoms_for(
            query, node_ids=sorted({node_id for nodes, _, _ in groups for node_id in nodes})
        )

    def atoms_of(node_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if node_id in atoms_text:
            text = atoms_text.pop(node_id)
            atoms_by_node[node_id] = (json.loads(text) if text else [], [])
        elif node_id in unread:
            atoms_by_node.update(_atoms_for(query, node_ids=sorted(unread)))
            unread.clear()
        return atoms_by_node.get(node_id, ([], []))

    def made() -> Iterator[Option]:
        for nodes, scores, group_score in groups:
            members = []
            for node_id, score in zip(nodes, scores, strict=True):
                rows, whole = atoms_of(node_id)
                member = member_choose(
                    request=request, node_id=node_id, score=score, rows=rows, whole=whole, salt=salt
                )
                if member is None:
                    break
                members.append(member)
            else:
                yield Option(members=tuple(members), score=group_score)

    return Options(made())


def _from_counts(query: PlanQuery) -> bool:
    """Whether the kept counts can choose the candidates: a plain or gang request starting now.

    The counts say what is free now, so a later start, a displacing plan (spot
    bookings count as free there) and a whole-node lease (every class must be
    free) rank the whole pool.
    """
    window = query.window
    return window.start <= window.now and not query.displace and query.request.binding != "node"


def _ranked(
    query: PlanQuery, *, limit: int, salt: int, from_counts: bool, atoms_with_ranking: int
) -> list[dict[str, Any]]:
    """One query: the best `limit` nodes (or gang groups) by score, of the candidates or of the pool.

    Ranked from the candidates, the first `atoms_with_ranking` nodes come with
    their free atoms (`atoms_read`).
    """
    request = query.request
    q = Params()
    salt_expr = q.p(salt, "bigint")
    candidates = ""
    if from_counts:
        candidates = candidates_sql(
            query, q=q, salt=salt, salt_expr=salt_expr, nodes=CANDIDATE_NODES, groups=CANDIDATE_GROUPS
        )
    ctes, _ = with_clause(query, q=q, candidates=candidates)
    scored = f"scored AS (SELECT f.*, {score_sql()} AS score FROM ({features_sql(request=request, q=q)}) f)"
    if request.gang_size:
        key = q.p(gang_key(request))
        size = q.p(request.gang_size, "int")
        node_tie, group_tie = _tie_sql("node_id", salt_expr), _tie_sql("gv", salt_expr)
        # Per label value, its best `size` nodes; a group with fewer cannot host the gang.
        sql = (
            f"{ctes},\n{scored},\n"
            f"ranked AS (SELECT node_id, score, labels ->> {key} AS gv,"
            f" row_number() OVER (PARTITION BY labels ->> {key} ORDER BY score DESC, {node_tie}) AS rn"
            " FROM scored)\n"
            f"SELECT gv, array_agg(node_id ORDER BY rn) AS nodes, array_agg(score ORDER BY rn) AS scores,"
            f" round(avg(score), 2) AS score FROM ranked WHERE rn <= {size}"
            f" GROUP BY gv HAVING count(*) >= {size} ORDER BY score DESC, {group_tie}"
            f" LIMIT {q.p(limit, 'int')}"
        )
    elif from_counts:
        # The candidates are few, so the first options' free atoms come back in the
        # same statement (`atoms`), saving the plan its second query. The others'
        # are not built (a `CASE` runs its subquery only where it is taken): each
        # node's were 0.1 M instructions of a create's 7.5 M placement.
        atoms = atoms_of_nodes_sql(request=request, node_ids_expr="s.node_id", one=True)
        order = f"score DESC, {_tie_sql('node_id', salt_expr)}"
        read = f"s.rank <= {q.p(atoms_with_ranking, 'int')}"
        sql = (
            f"{ctes},\n{scored}\n"
            f"SELECT s.node_id, s.score, {read} AS atoms_read,"
            f" CASE WHEN {read} THEN (SELECT json_agg(a) FROM ({atoms}) a)::text END AS atoms FROM ("
            f"SELECT node_id, score, row_number() OVER (ORDER BY {order}) AS rank FROM scored"
            f" ORDER BY {order} LIMIT {q.p(limit, 'int')}) s ORDER BY s.rank"
        )
    else:
        sql = (
            f"{ctes},\n{scored}\n"
            f"SELECT node_id, score FROM scored ORDER BY score DESC, {_tie_sql('node_id', salt_expr)}"
            f" LIMIT {q.p(limit, 'int')}"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, q.values)
        return row_dicts(cursor)


def _atoms_for(
    query: PlanQuery, *, node_ids: list[str]
) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Free atoms per shortlisted node (and, for whole-node leases, all of its atoms)."""
    request = query.request
    q = Params()
    # Only the shortlisted nodes: without this the CTEs (materialized, since
    # several reference them) would recount the whole pool a second time.
    ctes, _ = with_clause(query, q=q, only_node_ids=tuple(node_ids))
    ids_expr = q.p(node_ids, "text[]")
    sql = f"{ctes}\n{atoms_of_nodes_sql(request=request, node_ids_expr=ids_expr)}"
    if request.binding == "node":
        sql += f" UNION ALL {whole_node_atoms_sql(node_ids_expr=ids_expr)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, q.values)
        rows = row_dicts(cursor)
    out: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for row in rows:
        items, whole = out.setdefault(row["node_id"], ([], []))
        (whole if row["item"] == -1 else items).append(row)
    return out


def _no_fit_reason(*, request: ReservationRequest, displace: bool) -> Reason:
    wanted = ", ".join(f"{item.count} {item.device_class}" for item in request.devices)
    if request.gang_size:
        return Reason(
            "NO_GANG",
            f"no {request.gang_size} schedulable nodes sharing one {gang_key(request)!r} label"
            f" each have {wanted} free for the window",
        )
    if request.binding == "node":
        return Reason("NO_WHOLE_NODE", f"no schedulable node is wholly free for the window with {wanted}")
    return Reason(
        "NO_FIT",
        f"no schedulable node has {wanted} free for the window"
        + (" even by displacing spot reservations" if displace else ""),
    )


def plan_for_preview(*, request: ReservationRequest, pool: Pool, window: Window) -> tuple[Plan, Plan | None]:
    """The plan `capacity.preview` shows, and (regular requests that do not fit) the displacing one."""
    # A preview lists every option with its atoms: all of them come with the ranking.
    plan = placement_plan(request=request, pool=pool, window=window, atoms_with_ranking=SHORTLIST_SIZE)
    if plan.fits or request.spot:
        return plan, None
    return plan, placement_plan(
        request=request, pool=pool, window=window, displace=True, atoms_with_ranking=SHORTLIST_SIZE
    )
