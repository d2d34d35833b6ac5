"""The project-wide vocabulary: identifier patterns, time bounds and PostgreSQL error codes.

Each is defined here once and imported; an app's own vocabulary (device classes,
reservation states, ...) lives in that app's `constants.py` or `models.py`.
"""

from __future__ import annotations

# The patterns are written as the contract (and so the OpenAPI document, ECMA-262) spells them,
# `^…$`. Match them whole, with `re.fullmatch` (`core.api.fields.StrictRegexField` does): in Python
# `$` also matches before a final newline, so `re.match` would take `"acme\n"` for a tenant id.

# A tenant id, an idempotency key, a node report's hostname: the contract's plain identifier.
IDENT_REGEX = r"^[A-Za-z0-9._:-]{1,128}$"
TENANT_ID_REGEX = IDENT_REGEX

# What Python's `str.isspace` (and so `re`'s `\s` and `str.strip`) calls blank, spelled out: ECMA-262's
# `\s`, which the OpenAPI document's readers use, differs (it leaves out \u001c-\u001f and \u0085, and
# adds \ufeff), so a pattern that says `\s` would mean one thing to the server and another to a client.
BLANKS = (
    "\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
)

# A node label key that groups a gang's nodes (`fabric`): any characters but blanks and NUL.
TOPOLOGY_KEY_REGEX = f"^[^\\u0000{BLANKS}]{{1,128}}$"

# Prefixed ULIDs (`core.ids`), as the contract spells them.
POOL_ID_REGEX = r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$"
PROJECT_ID_REGEX = r"^prj_[0-9a-hjkmnp-tv-z]{26,52}$"
NODE_ID_REGEX = r"^node_[0-9a-hjkmnp-tv-z]{26,52}$"
RESERVATION_ID_REGEX = r"^rsv_[0-9a-hjkmnp-tv-z]{26,52}$"

# The largest time the contract accepts, in milliseconds since the epoch (2^47).
MAX_TIME_MS = 140737488355328

# SQLSTATEs the services react to (PostgreSQL's error codes appendix).
DEADLOCK_DETECTED = "40P01"
SERIALIZATION_FAILURE = "40001"

# The worker LISTENs here: a write that brings a deadline closer (a create, a
# renew, a node that needs its bookings repaired) sends a NOTIFY so the worker
# recomputes its next deadline instead of sleeping through it.
WORKER_CHANNEL = "worker_wake"
