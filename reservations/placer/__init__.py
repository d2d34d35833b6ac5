"""The placer: filters and scorers in SQL, a ranked shortlist, and the guarded commit.

Contract. Input: a validated `reservations.request_types.ReservationRequest`
and its pool. `plan.placement_window` fixes `[start, end)` by the database
clock; `plan.placement_plan` returns up to 10 ranked options (one node, or a
gang's members), each naming the atoms it would book, or a reason; it writes
nothing (`capacity.preview` shows it). `commit.placement_commit` walks the
shortlist inside the caller's transaction with the guard-4 locks, the guard-1
booking insert and the guard-3 scalar claims, replanning a bounded number of
times, and raises `NoCapacity` with the placer's reason; `commit.placement_charge`
applies quota (guard 5) and rollup deltas in the same transaction.
"""
