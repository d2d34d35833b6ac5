"""docs/architecture.md lists every module of the house, as the tree has it now.

docs/architecture_modules.py writes the list from the files; this test writes
it again and compares, so a module added, moved or removed without
`make architecture` fails here.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.paths import ROOT
from tests.support.scripts import load_script as load_script_at

SCRIPT = ROOT / "docs" / "architecture_modules.py"


def load_script() -> ModuleType:
    return load_script_at(SCRIPT, "docs_architecture_modules")


def test_the_document_lists_every_module_the_tree_has() -> None:
    script = load_script()
    document = script.DOCUMENT.read_text(encoding="utf-8")
    assert script.document_with_list(document) == document, (
        "docs/architecture.md's module list is stale: run `make architecture` and commit it"
    )
    for package in script.PACKAGES:
        for path in script.modules_of(package):
            assert f"`{path.relative_to(ROOT).as_posix()}`" in document, path


def test_a_module_the_document_does_not_name_is_listed_with_its_docstring(tmp_path: Path) -> None:
    """The check is not a copy of itself: a new module changes the list, under its app."""
    script = load_script()
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "probe.py").write_text('"""A module added without redrawing."""\n', encoding="utf-8")
    listed = script.module_list(root=tmp_path)
    assert "* `core/probe.py`: A module added without redrawing." in listed
    assert listed != script.module_list()
