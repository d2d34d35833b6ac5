"""The CLI's selector text for the operators' `manage.py capacity --selector`.

The syntax has one reader, `better_compute.device_match` (the tenants' CLI, which
never imports the server's code); here its clauses are typed by the server's
attribute registry and each one normalized as the API normalizes a selector,
so the operators' and the tenants' CLIs read the same text the same way.
"""

from __future__ import annotations

from typing import Any

from better_compute.device_match import read_clauses, selector_text
from core.errors import InvalidInput
from inventory.attributes import attribute_type
from reservations.request.device_match import normalize_entry
from reservations.request.types import Selector


class SelectorSyntaxError(InvalidInput):
    """A CLI selector clause that cannot be read; `clause` is the text as written."""

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None, clause: str = "") -> None:
        super().__init__(message, details)
        self.clause = clause


def _server_kind(name: str) -> type:
    # An attribute the server does not know stays text; normalizing it names the problem.
    return attribute_type(name) or str


def parse_cli_selector(text: str) -> Selector:
    """The CLI's comma-separated clauses as a Selector; SelectorSyntaxError names each bad clause."""
    if not isinstance(text, str):
        raise SelectorSyntaxError(
            "selector: must be text", [{"field": "selector", "message": "must be text"}]
        )
    if not text.strip():
        return {}
    selector: Selector = {}
    problems: list[tuple[str, str]] = []
    for clause in read_clauses(text, kind_of=_server_kind):
        if clause.problem is not None or clause.name is None or clause.spec is None:
            problems.append((clause.text, clause.problem or "cannot be read"))
            continue
        entry, problem = normalize_entry(clause.name, clause.spec)
        if problem is not None:
            problems.append((clause.text, f"{clause.name}: {problem}"))
        elif entry is not None:
            selector[clause.name] = entry
    if problems:
        details = [{"field": "selector", "message": f"clause {c!r}: {m}"} for c, m in problems]
        raise SelectorSyntaxError.from_details(details, clause=problems[0][0])
    return selector


def selector_to_cli(selector: Selector) -> str:
    """The CLI text of a normalized selector (`parse_cli_selector` reads it back)."""
    return selector_text(selector)
