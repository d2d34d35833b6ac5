"""Named PostgreSQL advisory locks, one key per singleton job.

Keys are fixed integers so every replica (and every release) agrees on them;
never reuse a key for another job.
"""

from __future__ import annotations

ADVISORY_LOCK_KEYS: dict[str, int] = {
    # worker.reconciler's one-off pass, and the worker's periodic rebuild: one rebuild at a time.
    "rollup-reconciler": 7_301_001,
    # The worker's jobs (worker.jobs): several workers may run, each job runs in one at a time.
    "worker:lease-expire": 7_301_011,
    "worker:reservation-settle": 7_301_012,
    "worker:bookings-advance": 7_301_013,
    "worker:nodes-stale": 7_301_014,
    "worker:bookings-repair": 7_301_015,
    "worker:outbox-deliver": 7_301_016,
    "worker:rate-windows-prune": 7_301_017,
    "worker:usage-close": 7_301_018,
    "worker:maintenance-windows": 7_301_019,
}
