"""How much the torture and fault runs do, and which schedule: the same code at every size.

`SOAK=1` (`make soak`) runs ten times the operations and faults; `TORTURE_SEED`
picks another schedule.
"""

from __future__ import annotations

import os

SOAK = os.environ.get("SOAK", "") not in ("", "0")
SCALE = 10 if SOAK else 1
SEED = int(os.environ.get("TORTURE_SEED", "20261130"))
# A bound that only stops a broken run from hanging; never part of an assertion.
JOIN_SECONDS = 1_800
