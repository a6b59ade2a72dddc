"""The code base's size rule: no function over 80 lines, no module over 500.

A function that long does several things at once, and the reader has to hold them all; one
made of named steps reads top-down. A module that long usually holds several topics (a big
one that holds one topic is fine, and is listed below with its reason). The packages are read
as source (nothing is imported); a function counts from its `def` line to its last line, its
decorators aside, and a nested function counts inside its parent as well as on its own.

The exceptions are named one by one with the reason they stand; the rule holds everywhere
else, and a new exception needs a reason of its own here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "web", "tasks", "workers", "models", "ops")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500

# path -> why it is still over MAX_MODULE_LINES
LONG_MODULES: dict[str, str] = {}
# "path:function" -> why it is still over MAX_FUNCTION_LINES
LONG_FUNCTIONS: dict[str, str] = {}


def modules() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.py"))


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function and method in `path`, nested ones too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_over_80_lines():
    over = []
    for path in modules():
        rel = path.relative_to(ROOT).as_posix()
        for name, line, lines in function_lengths(path):
            if lines > MAX_FUNCTION_LINES and f"{rel}:{name}" not in LONG_FUNCTIONS:
                over.append(f"{rel}:{line} {name}: {lines} lines")
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named "
                      "steps, or list one in LONG_FUNCTIONS with the reason):\n"
                      + "\n".join(over))


def test_no_module_over_500_lines():
    over = []
    for path in modules():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES and rel not in LONG_MODULES:
            over.append(f"{rel}: {lines} lines")
    assert not over, (f"modules over {MAX_MODULE_LINES} lines (split them by topic, or list "
                      "one in LONG_MODULES with the reason):\n" + "\n".join(over))


def test_every_exception_names_code_that_exists():
    # An exception left behind by a rename or a move would excuse nothing, and hide that.
    names = {f"{p.relative_to(ROOT).as_posix()}:{name}"
             for p in modules() for name, _, _ in function_lengths(p)}
    known = {p.relative_to(ROOT).as_posix() for p in modules()}
    gone = sorted((set(LONG_MODULES) - known) | (set(LONG_FUNCTIONS) - names))
    assert not gone, f"exceptions that name no module or function any more: {gone}"


def test_the_rule_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"@decorated\ndef long():\n{body}\n\ndef short():\n    pass\n")
    assert function_lengths(path) == [("long", 2, MAX_FUNCTION_LINES + 1),
                                      ("short", MAX_FUNCTION_LINES + 4, 2)]
