"""A fake node daemon: guard 6, defence in depth on the node side.

The real daemon keeps its own record of what it was told to run and refuses
an assignment that overlaps one it already holds, whatever the control plane
believes. This stand-in keeps that record in its own tables:

* `fake_daemon_assignments`: the atoms (node, device uid, reservation,
  `[starts_at, ends_at)`), checked for overlaps in Python against what it
  holds, never trusting the control plane's constraint;
* `fake_daemon_claims`: one row per allocation with its scalar claims
  (`vcpu`, `memoryGiB`, `hugepages1Gi`) and the node profile it was asked to
  run, for the allocation's window. An assignment whose claims, added to what
  the node already holds for overlapping windows, exceed what the node has
  (`floor(allocatable * ratio)`, what it reported) is refused like an
  overlapping atom.

A refused assignment answers `AllocationFailed` and leaves no trace on the
node; the control plane releases the reservation. The node side never calls
the control plane: it answers, and the caller acts.

Assignments are delivered after the booking transaction commits, through the
outbox (`reservations.delivery.outbox`), never while the placer's locks are held. Every
delivery is idempotent: an assignment the node already holds adds nothing.

The stand-in is in four rooms: `base` (the refusal, an assignment, a node's
turn), `assign` (accepting a reservation's atoms and claims, or refusing
them), `shorten` (cutting the node's record to shortened bookings) and
`holdings` (what the node believes it holds, for the resync and the tests).
"""

from reservations.delivery.daemon.assign import daemon_assign, daemon_deliver, daemon_open
from reservations.delivery.daemon.base import AllocationFailed, Assignment, NodeAssignment
from reservations.delivery.daemon.holdings import (
    ClaimHolding,
    daemon_behind,
    daemon_claims,
    daemon_holdings,
)
from reservations.delivery.daemon.shorten import SHORTEN_LOCK_SQL, daemon_shorten

__all__ = [
    "SHORTEN_LOCK_SQL",
    "AllocationFailed",
    "Assignment",
    "ClaimHolding",
    "NodeAssignment",
    "daemon_assign",
    "daemon_behind",
    "daemon_claims",
    "daemon_deliver",
    "daemon_holdings",
    "daemon_open",
    "daemon_shorten",
]
