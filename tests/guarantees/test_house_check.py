"""`tools/house_check.py`, the size and circle rules of `make lint`, fails where it should.

The tree passes it (`make lint` runs it); these show it is not a check that
cannot fail: a long function, a long module and a circle are each caught, and
SQL text is not counted.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.paths import ROOT
from tests.support.scripts import load_script as load_script_at


def load_script() -> ModuleType:
    return load_script_at(ROOT / "tools" / "house_check.py", "tools_house_check")


def _function(name: str, body_lines: int) -> str:
    return f"def {name}() -> None:\n" + "    x = 1\n" * (body_lines - 1)


def test_a_function_over_80_lines_is_refused_and_one_of_80_is_not(tmp_path: Path) -> None:
    script = load_script()
    module = tmp_path / "rooms.py"
    module.write_text(_function("kept", 80) + "\n\n" + _function("too_long", 81))
    problems = script.size_problems(module, root=tmp_path)
    assert problems == ["rooms.py:83: too_long() is 81 lines (at most 80)"]


def test_a_module_over_500_lines_is_refused_but_its_sql_text_does_not_count(tmp_path: Path) -> None:
    script = load_script()
    sql = 'QUERY = """\nSELECT 1\n' + "  FROM t\n" * 200 + '"""\n'
    code = "\n".join(f"X{i} = {i}" for i in range(480)) + "\n"
    module = tmp_path / "sql_heavy.py"
    module.write_text(code + sql)
    assert script.size_problems(module, root=tmp_path) == []
    module.write_text(code + sql.replace('"""\nSELECT', '"""\nhello', 1))
    assert script.size_problems(module, root=tmp_path) == [
        "sql_heavy.py: 683 lines (at most 500, SQL text excepted)"
    ]


def test_import_circles_are_found_and_a_one_way_chain_is_not() -> None:
    script = load_script()
    assert script.strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert script.strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_tree_keeps_the_house_rules() -> None:
    script = load_script()
    problems = [p for path in script.python_files() for p in script.size_problems(path)]
    assert problems == []
    assert script.import_cycles() == []
