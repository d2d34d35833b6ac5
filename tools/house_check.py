"""The house rules that import-linter cannot say: sizes and import circles.

`make lint` runs it. A module over 500 lines or a function over 80 is a room
doing more than one job; an import circle is two rooms that cannot be read
apart. Lines of SQL text (a multi-line string that reads as SQL) and
migrations do not count: a statement is as long as it must be.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the import contracts graph (pyproject.toml), and the scripts beside the code.
PACKAGES = (
    *tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"],
    "tools",
    "docs",
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
SQL_START = re.compile(
    r"^\s*(--|\(?\s*(WITH|SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|DO|VALUES)\b)", re.I
)


def python_files(packages: Iterable[str] = PACKAGES) -> Iterator[Path]:
    for package in packages:
        base = ROOT / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def sql_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by multi-line string constants that are SQL text."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        end = node.end_lineno or node.lineno
        if end > node.lineno and SQL_START.match(node.value.lstrip("\n")):
            lines.update(range(node.lineno, end + 1))
    return lines


def size_problems(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    sql = sql_lines(tree)
    rel = path.relative_to(root)
    problems = []
    total = source.count("\n") + (0 if source.endswith("\n") else 1)
    counted = total - len(sql)
    if counted > MAX_MODULE_LINES:
        problems.append(f"{rel}: {counted} lines (at most {MAX_MODULE_LINES}, SQL text excepted)")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            span = set(range(start, node.end_lineno + 1)) - sql
            if len(span) > MAX_FUNCTION_LINES:
                problems.append(
                    f"{rel}:{node.lineno}: {node.name}() is {len(span)} lines (at most {MAX_FUNCTION_LINES})"
                )
    return problems


def import_cycles() -> list[list[str]]:
    """Circles among modules of one package, function-level imports included."""
    import grimp

    packages = [p for p in PACKAGES if (ROOT / p / "__init__.py").exists()]
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges: dict[str, set[str]] = {m: set() for m in graph.modules}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            same_root = imported in edges and imported.split(".")[0] == module.split(".")[0]
            # A package's __init__ importing its own modules is how a package says what it offers.
            nested = imported.startswith(module + ".") or module.startswith(imported + ".")
            if same_root and not nested:
                edges[module].add(imported)
    return strongly_connected(edges)


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module: each is at least one circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def main() -> int:
    problems = [p for path in python_files() for p in size_problems(path)]
    problems += ["import circle: " + " <-> ".join(c) for c in import_cycles()]
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} house rule(s) broken (tools/house_check.py)")
        return 1
    print("house rules kept: no module over 500 lines, no function over 80, no import circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
