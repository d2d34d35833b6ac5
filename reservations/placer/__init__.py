"""The placer: filters and scorers in SQL, a ranked shortlist, and the guarded commit.

Contract. Input: a validated `reservations.request.types.ReservationRequest`
and its pool. `plan.placement_window` fixes `[start, end)` by the database
clock; `plan.placement_plan` returns up to 10 ranked options (one node, or a
gang's members), each naming the atoms it would book, or a reason; it writes
nothing (`capacity.preview` shows it). A plan starting now is one query: the
kept per-node counts (`reservations.models.NodeAtomCount`) name a bounded set
of candidates and only those are probed, so its cost does not grow with the
pool (the first three options' atoms come with it, the others' in a second
query if a commit gets past those, a preview's all in the first); a later
start, a displacing plan, a whole-node lease, or candidates of which none
fits, rank the whole pool in two queries. `commit.placement_commit`
walks the shortlist inside the caller's transaction with the guard-4 locks,
the guard-1 booking insert and the guard-3 scalar claims, replanning a bounded
number of times, and raises `NoCapacity` with the placer's reason;
`commit.placement_charge` applies quota (guard 5) and rollup deltas in the
same transaction. `cut.reservation_cut` is the one way bookings end (a
release, a lease expiry, a settlement, a spot notice: `notice.spot_notice`),
giving back scalars, quota and rollup counts; `plan.plan_for_preview` is the
read-only plan `capacity.preview` shows.

Decisions where the specification is silent:

* Several device items of one request all land on the same node (each gang
  member takes every item). A request-level `topology: nvlink-all` applies to
  each whole-GPU item; an item's own `topology` applies to that item.
* Scalar claims are taken from `node_resources` when the reservation is made,
  even for a later start: the counter has no time axis, so claiming early is
  the conservative choice, and the booking horizon (`CAPACITY_MAX_START_AHEAD`)
  bounds how long ahead of its start a claim can be held (docs/decisions.md).
  They are given back on release, on a spot notice, or when the reconciler
  settles a reservation that ran to its end.
* Quota is charged per atom class booked (`gpu`, `gpu.mig`, ... and, for a
  whole-node lease, every class it takes) and per scalar times nodes.
* Displacement: a regular request that fits nowhere is planned again treating
  live spot bookings as free. When a spot booking on the chosen atoms stands
  in the request's own window, it starts at `max(start, now + noticeSeconds)`;
  an option that displaces nothing (its atoms were simply free by commit
  time) keeps the request's own window. When displacing, every spot
  reservation it takes atoms from is cut to end then (its later bookings are
  deleted, a spot that had not started is `preempted` at once), and its
  scalars and quota are given back at notice time. Such a spot reservation
  reads `preempted` once its notice has run out.
* Atom choice on a node: free atoms before spot-booked ones; one NVLink domain
  when asked; the NUMA node that holds the whole count with the fewest free
  atoms (best fit), else the largest NUMA groups first.
* Whole-node leases need every bookable atom of the node healthy and free for
  the window, and book all of them, the `node` atom included.
"""
