"""The typed attribute registry: one type per attribute name.

Selectors are checked against it, so `{"vramGiB": {"gte": "80"}}` is refused
rather than silently compared as text. Node labels are readable as
`node.<label>` and are strings.
"""

from __future__ import annotations

ATTRIBUTE_TYPES: dict[str, type] = {
    "gpuProduct": str,
    "gpuModel": str,
    "vramGiB": int,
    "numaNode": int,
    "pciBusId": str,
    "nvlinkDomain": str,
    "migProfile": str,
    "memoryGiB": int,
    "slotIndex": int,
    "linkGbps": int,
    "sizeGiB": int,
    "media": str,
}

NODE_LABEL_PREFIX = "node."


def attribute_type(name: str) -> type | None:
    """The type of an attribute or node label, or None when the name is unknown."""
    if name.startswith(NODE_LABEL_PREFIX) and len(name) > len(NODE_LABEL_PREFIX):
        return str
    return ATTRIBUTE_TYPES.get(name)
