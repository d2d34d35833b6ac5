"""The admin through Django's test client."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any


def messages_of(response: Any) -> list[str]:
    """The messages the admin showed on `response` (followed to its last page)."""
    return [str(m) for m in response.context["messages"]]


class _ResultLinks(HTMLParser):
    """The hrefs in the rows of the changelist's result table (`#result_list tbody`), in page order."""

    def __init__(self) -> None:
        super().__init__()
        self.in_results = False
        self.in_rows = False
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "table" and values.get("id") == "result_list":
            self.in_results = True
        elif tag == "tbody" and self.in_results:
            self.in_rows = True
        elif tag == "a" and self.in_rows and values.get("href"):
            self.links.append(str(values["href"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self.in_rows = False
        elif tag == "table":
            self.in_results = False


def links_of(page: str) -> list[str]:
    """The links in the rows of an admin list, as an operator would click them."""
    parser = _ResultLinks()
    parser.feed(page)
    return parser.links
