"""Named PostgreSQL advisory locks, one key per singleton job.

Keys are fixed integers so every replica (and every release) agrees on them;
never reuse a key for another job.
"""

from __future__ import annotations

ADVISORY_LOCK_KEYS: dict[str, int] = {
    # capacity.reconciler: only one replica rebuilds rollups (and runs its hooks) at a time.
    "rollup-reconciler": 7_301_001,
}
