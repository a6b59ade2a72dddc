"""The import graph of the code base: no cycle, and no import inside a function without its
reason.

The packages are read as source (nothing is imported): every `import` and `from ... import`
that names a module of app, web, tasks, workers, models or ops is an edge, at module level or
inside a function alike, so a cycle hidden behind a function-local import fails too. An
import inside a function is there for a reason the next reader must see (torch stays out of
the web, prometheus_client waits for the multiprocess set-up, a command loads what it alone
needs): a `#` comment on its line, or on the line above the block of imports it opens.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "web", "tasks", "workers", "models", "ops")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: Path
    line: int
    end_line: int
    targets: tuple[str, ...]  # the project's modules it names
    in_function: bool
    type_checking: bool


def project_modules() -> dict[str, Path]:
    mods = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> list[Import]:
    found = []
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def visit(node: ast.AST, in_function: bool, type_checking: bool,
                  module: str = module, path: Path = path, package: str = package) -> None:
            for child in ast.iter_child_nodes(node):
                fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                tc = type_checking or (isinstance(child, ast.If)
                                       and "TYPE_CHECKING" in ast.unparse(child.test))
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join(parts + ([base] if base else []))
                    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                             for a in child.names]
                else:
                    visit(child, fn, tc)
                    continue
                targets = {t for t in (_resolve(n, mods) for n in names) if t and t != module}
                found.append(Import(module, path, child.lineno, child.end_lineno or child.lineno,
                                    tuple(sorted(targets)), in_function, type_checking))

        visit(ast.parse(path.read_text(encoding="utf-8")), False, False)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def test_no_import_cycle_even_through_function_local_imports():
    mods = project_modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for imp in imports(mods):
        if not imp.type_checking:  # annotations only: never executed
            edges[imp.module].update(imp.targets)
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _has_reason(lines: list[str], imp: Import, block_start: int) -> bool:
    own = any("#" in lines[n - 1] for n in range(imp.line, imp.end_line + 1))
    above = lines[block_start - 2].strip() if block_start >= 2 else ""
    return own or above.startswith("#")


def test_every_function_local_import_says_why():
    mods = project_modules()
    found = [i for i in imports(mods) if i.in_function and not i.type_checking]
    missing = []
    sources: dict[Path, list[str]] = {}
    for imp in found:
        lines = sources.setdefault(imp.path, imp.path.read_text(encoding="utf-8").splitlines())
        # A block of imports shares the reason above its first line (blank lines between
        # the block's imports, as isort leaves them, do not end it).
        start = imp.line
        while start > 2:
            prev = lines[start - 2].strip()
            if prev.startswith(("import ", "from ")) or (
                    not prev and lines[start - 3].strip().startswith(("import ", "from "))):
                start -= 1
            else:
                break
        if not _has_reason(lines, imp, start):
            missing.append(f"{imp.path.relative_to(ROOT)}:{imp.line}: "
                           f"{lines[imp.line - 1].strip()}")
    assert not missing, ("imports inside functions without a reason (a `#` comment on the "
                         "line or above the block):\n" + "\n".join(missing))


def test_the_models_import_nothing_of_the_farm():
    """`models/` is the compute a voice needs and nothing else: it may be loaded in any process
    (a benchmark, a notebook) without the farm's settings, stores or broker. So no module of
    it names app, web, tasks, workers or ops, even inside a function."""
    mods = project_modules()
    farm = ("app", "web", "tasks", "workers", "ops")
    found = [f"{imp.path.relative_to(ROOT)}:{imp.line} imports {target}"
             for imp in imports(mods) if imp.module.split(".")[0] == "models"
             for target in imp.targets if target.split(".")[0] in farm]
    assert not found, "\n".join(found)
