"""No import cycles among fsage's modules at module level: every module can be imported first,
in any order. Imports under ``if TYPE_CHECKING:`` and inside functions are not followed (they
do not run when the module is imported)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name != "TYPE_CHECKING":
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body)
            for handler in node.handlers:
                yield from _module_level(handler.body)
            yield from _module_level(node.orelse)
            yield from _module_level(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports at module level. ``from p import x`` depends
    on the submodule ``p.x`` where there is one, else on ``p`` (a name its ``__init__`` makes);
    a parent package that a submodule's import initialises first is no dependency of it."""
    mods = _modules(root, package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = mod if is_pkg else mod.rpartition(".")[0]
        for node in _module_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                src = node.module or ""
                if node.level:
                    up = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                    src = ".".join(up + ([node.module] if node.module else []))
                subs = [f"{src}.{a.name}" for a in node.names]
                names = [sub if sub in mods else src for sub in subs]
            graph[mod].update(n for n in names if n in mods and n != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_fsage_has_no_module_level_import_cycle() -> None:
    graph = import_graph(REPO, "fsage")
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # it read the package
    assert cycles(graph) == []


def test_a_cycle_is_found_and_python_agrees_it_is_one(tmp_path: Path) -> None:
    """The checker against the interpreter: a package whose two modules import a name from
    each other fails to import, and is the one cycle found; the same modules with one import
    moved under TYPE_CHECKING import, and no cycle is found."""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "c.py").write_text("X = 1\n")
    (pkg / "a.py").write_text("from cyc.b import B\nfrom cyc import c\nA = 1\n")
    (pkg / "b.py").write_text("from .a import A\nB = 2\n")

    def imports() -> bool:
        argv = [sys.executable, "-c", "import cyc.a"]
        return subprocess.run(argv, cwd=tmp_path, capture_output=True).returncode == 0

    graph = import_graph(tmp_path, "cyc")
    assert graph["cyc.a"] == {"cyc.b", "cyc.c"}
    assert not imports() and cycles(graph) == [["cyc.a", "cyc.b"]]
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\nB = 2\n"
    )
    assert imports() and cycles(import_graph(tmp_path, "cyc")) == []
