"""What in a new OpenAPI document would break a client generated from the old one.

`make openapi` runs this between the committed docs/openapi.json and the one the
code now serves, before it rewrites the file, and refuses a breaking change
unless `BREAKING=1` says it is meant (with `info.version`'s major raised). A
break is:

* a method (path) removed;
* a status a method answered removed;
* a field removed from a response object, or a value removed from a response enum;
* a request field made required, or a new required request field;
* a request field removed where unknown fields are refused (old bodies would fail).

Additions are never breaks: methods, statuses, optional request fields,
response fields. Usage: `python tools/openapi_breaking.py OLD.json NEW.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Document = dict[str, Any]


def _resolve(document: Document, schema: Any) -> Any:
    while isinstance(schema, dict) and "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = document["components"]["schemas"][name]
    return schema


def _body_schema(document: Document, holder: dict[str, Any]) -> Any:
    content = holder.get("content", {}).get("application/json", {})
    return _resolve(document, content.get("schema"))


def _response_breaks(old_doc: Document, new_doc: Document, old: Any, new: Any, where: str) -> list[str]:
    """Fields or enum values a client reads that the new response no longer has."""
    old, new = _resolve(old_doc, old), _resolve(new_doc, new)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return []
    breaks: list[str] = []
    new_values: list[Any] = new.get("enum") or old.get("enum") or []
    for value in old.get("enum", []):
        if value not in new_values:
            breaks.append(f"{where}: value {value!r} removed")
    for name, old_field in old.get("properties", {}).items():
        if name not in new.get("properties", {}):
            breaks.append(f"{where}.{name}: response field removed")
        else:
            new_field = new["properties"][name]
            breaks += _response_breaks(old_doc, new_doc, old_field, new_field, f"{where}.{name}")
    for key in ("items", "additionalProperties"):
        breaks += _response_breaks(old_doc, new_doc, old.get(key), new.get(key), f"{where}[]")
    parts = zip(old.get("allOf", []), new.get("allOf", []), strict=False)
    for index, (old_part, new_part) in enumerate(parts):
        breaks += _response_breaks(old_doc, new_doc, old_part, new_part, f"{where}.allOf[{index}]")
    return breaks


def _request_breaks(old_doc: Document, new_doc: Document, old: Any, new: Any, where: str) -> list[str]:
    """What a body the old document accepted would now be refused for."""
    old, new = _resolve(old_doc, old), _resolve(new_doc, new)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return []
    breaks = [
        f"{where}.{name}: request field now required"
        for name in sorted(set(new.get("required", [])) - set(old.get("required", [])))
    ]
    new_properties = new.get("properties", {})
    for name, old_field in old.get("properties", {}).items():
        if name not in new_properties:
            if new.get("additionalProperties") is False:
                breaks.append(f"{where}.{name}: request field removed")
        else:
            breaks += _request_breaks(old_doc, new_doc, old_field, new_properties[name], f"{where}.{name}")
    return breaks


def breaking_changes(old: Document, new: Document) -> list[str]:
    """Every break, one line each, in path order."""
    breaks: list[str] = []
    for path, old_item in sorted(old.get("paths", {}).items()):
        new_item = new.get("paths", {}).get(path)
        if new_item is None:
            breaks.append(f"{path}: method removed")
            continue
        for verb, old_operation in old_item.items():
            new_operation = new_item.get(verb)
            if new_operation is None:
                breaks.append(f"{verb.upper()} {path}: removed")
                continue
            old_answers, new_answers = old_operation.get("responses", {}), new_operation.get("responses", {})
            for status, old_answer in old_answers.items():
                if status not in new_answers:
                    breaks.append(f"{path}: status {status} removed")
                    continue
                breaks += _response_breaks(
                    old,
                    new,
                    _body_schema(old, old_answer),
                    _body_schema(new, new_answers[status]),
                    f"{path} {status}",
                )
            breaks += _request_breaks(
                old,
                new,
                _body_schema(old, old_operation.get("requestBody", {})),
                _body_schema(new, new_operation.get("requestBody", {})),
                f"{path} body",
            )
    return breaks


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: openapi_breaking.py OLD.json NEW.json", file=sys.stderr)
        return 2
    old, new = (json.loads(Path(name).read_text()) for name in argv[1:])
    breaks = breaking_changes(old, new)
    for line in breaks:
        print(f"breaking: {line}")
    return 1 if breaks else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
