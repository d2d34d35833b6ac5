"""The picture of the layers in docs/architecture.md is the code's, not a drawing that rots.

docs/architecture_graph.py draws docs/architecture.svg from the import graph;
this test draws it again and compares. When it fails, an import between the
apps changed: run `make architecture` and commit the new picture (and if an
arrow turned red, fix the import instead: `make lint` fails on it too).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.paths import ROOT
from tests.support.scripts import load_script as load_script_at

SCRIPT = ROOT / "docs" / "architecture_graph.py"
PICTURE = ROOT / "docs" / "architecture.svg"


def load_script() -> ModuleType:
    return load_script_at(SCRIPT, "docs_architecture_graph")


def test_committed_picture_is_the_one_the_imports_draw(tmp_path: Path) -> None:
    script = load_script()
    fresh = tmp_path / "architecture.svg"
    assert script.main(["--output", str(fresh)]) == 0
    assert fresh.read_text(encoding="utf-8") == PICTURE.read_text(encoding="utf-8"), (
        "docs/architecture.svg is out of date with the imports: run `make architecture` and commit it"
    )


def test_picture_is_deterministic() -> None:
    script = load_script()
    assert script.build_svg() == script.build_svg()


def test_upward_import_is_drawn_red() -> None:
    """The picture is not just a pretty copy: an arrow against the layers shows in red."""
    script = load_script()
    arrows, modules = script.app_imports()
    arrows[("core", "capacity")] += 1
    svg = script.render(arrows, modules)
    assert "point UP" in svg
    assert "core -&gt; capacity" in svg
    assert f'stroke="{script.UP}"' in svg
