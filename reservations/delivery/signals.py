"""The delivery's news for the control plane: a node refused an assignment (guard 6).

Sent with `reservation_id` and `refusal` (the node's `AllocationFailed`) when a
node refuses a live reservation's assignment, by the daemon's transport
(`sending`) or the agent's (`agent`); `reservations.services` releases the
reservation on it. A receiver that raises fails the delivery.
"""

from __future__ import annotations

from django.dispatch import Signal

assignment_refused = Signal()
