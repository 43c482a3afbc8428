"""The house rules of rlkit/ (docs/architecture.md), read from the source without importing it: no import cycle
between its modules (imports inside functions count: hiding one there does not remove it), the GRPO recipe reads
on a few screens, no module grows past 800 lines, and the levers removed as dead ends (conf/compat.yaml
``removed``) do not come back under their names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rlkit"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = f
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the rlkit modules it imports anywhere in its file}. ``from a.b import c`` counts as importing
    ``a.b.c`` when that is a module, else ``a.b``; a name resolves to its longest module prefix."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, f in modules.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            for t in targets:
                r = resolve(t) if t.startswith("rlkit") else None
                if r and r != m:
                    graph[m].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_rlkit():
    found = cycles(import_graph(_modules()))
    assert found == [], f"import cycles inside rlkit/: {found}"


def test_recipe_is_short_and_no_module_is_huge():
    assert len((PKG / "recipes" / "grpo.py").read_text().splitlines()) <= 400
    big = {str(f.relative_to(ROOT)): n for f in PKG.rglob("*.py") if (n := len(f.read_text().splitlines())) > 800}
    assert big == {}


def test_removed_levers_stay_out_of_the_core():
    removed = yaml.safe_load((ROOT / "conf" / "compat.yaml").read_text())["removed"]
    names = {k.rsplit(".", 1)[1] for k in removed}
    assert {"screening_samples", "decoupled_loss", "mask_unexecuted", "route_coef", "route_context"} <= names
    pattern = re.compile("|".join(sorted(map(re.escape, names))))
    hits = [f"{f.relative_to(ROOT)}:{i}" for f in PKG.rglob("*.py")
            for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
