"""The house rules of rlkit/ (docs/architecture.md), read from the source without importing it: no import cycle
between its modules (imports inside functions count: hiding one there does not remove it), no import running back
up between the house's rooms and at most 8 floors of them, the GRPO recipe reads on a few screens, no module grows
past 800 lines, and the levers removed as dead ends (conf/compat.yaml ``removed``) do not come back under their
names."""

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


def import_graph(modules: dict[str, Path], roots: tuple[str, ...] = ("rlkit",)) -> dict[str, set[str]]:
    """{module: the modules of ``modules`` it imports anywhere in its file}, following imported names that start
    with one of ``roots``. ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else ``a.b``; a
    name resolves to its longest module prefix."""

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
                r = resolve(t) if t.startswith(roots) else None
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


#: The house's top-level folders of Python besides rlkit/ (tests/ is not a room: it may import anything).
HOUSE = ("envs", "rewards", "launchers", "hydra_plugins", "scripts", "bench")


def room_of(rel: Path) -> str:
    """A room of the house: a module directly in rlkit/ (``rlkit/run.py``), a package in rlkit/ (``rlkit/policy/``),
    a top-level folder (``launchers/``) or a top-level file (``train.py``)."""
    if rel.parts[0] == "rlkit":
        return "/".join(rel.parts) if len(rel.parts) == 2 else f"rlkit/{rel.parts[1]}/"
    return rel.parts[0] if len(rel.parts) == 1 else rel.parts[0] + "/"


def room_graph() -> dict[str, set[str]]:
    """{room: the rooms it imports anywhere in its files}, over rlkit/, the folders in ``HOUSE`` and train.py.
    Importing the package ``rlkit`` itself (rlkit/__init__.py) is no arrow."""
    files = [f.relative_to(ROOT) for top in ("rlkit", *HOUSE) for f in (ROOT / top).rglob("*.py")] + [Path("train.py")]
    modules = {}
    for rel in files:
        parts = rel.with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = rel
    graph = {room_of(rel): set() for rel in files}
    for mod, targets in import_graph(modules, roots=tuple(t + "." for t in ("rlkit", *HOUSE)) + ("train",)).items():
        src = room_of(modules[mod])
        graph[src] |= {room_of(modules[t]) for t in targets if modules[t] != Path("rlkit/__init__.py")} - {src}
    graph.pop("rlkit/__init__.py", None)
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor in a graph without cycles: 1 for a room that imports no other, else one above the highest
    room it imports. Raises ValueError on a cycle."""
    out: dict[str, int] = {}

    def floor(v: str, path: tuple[str, ...]) -> int:
        if v in path:
            raise ValueError(f"cycle: {' -> '.join(path[path.index(v):] + (v,))}")
        if v not in out:
            out[v] = 1 + max((floor(w, path + (v,)) for w in graph[v]), default=0)
        return out[v]

    for v in sorted(graph):
        floor(v, ())
    return out


def test_floors_of_a_small_house():
    assert floors({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}
    assert cycles({"policy/": {"serve/"}, "serve/": {"policy/"}}) == [["policy/", "serve/"]]


def test_no_import_runs_back_up_and_the_house_has_at_most_8_floors():
    """Between rooms (rlkit's modules and packages, envs/, rewards/, launchers/, hydra_plugins/, scripts/, bench/,
    train.py)
    every import runs down: no two rooms import each other, even through others (an arrow back up is a cycle of
    rooms), and the longest chain of imports is at most 8 rooms (issue 76: 11 before the run folder's records,
    the swept keys and the demonstrations moved low, and the vLLM facts left serve/)."""
    graph = room_graph()
    assert cycles(graph) == [], f"imports running back up between rooms: {cycles(graph)}"
    height = floors(graph)
    top = max(height.values())
    assert top <= 8, f"{top} floors: " + ", ".join(f"{r} {n}" for r, n in sorted(height.items(), key=lambda x: -x[1]))
    doors = ("train.py", "rlkit/train.py", "scripts/")  # the Hydra app (python train.py = rlkit-train) and the tools
    assert not any("rlkit/run.py" in targets for room, targets in graph.items() if room not in doors)


def test_tools_and_benchmarks_import_without_a_sys_path_preamble():
    """scripts/ imports rlkit as installed (editable in a checkout); bench/ runs as ``python -m bench.<name>`` from the
    root. A benchmark shares code through bench/common.py only, never by importing another benchmark."""
    preambles = [str(f.relative_to(ROOT)) for top in ("scripts", "bench") for f in (ROOT / top).rglob("*.py")
                 if "sys.path" in f.read_text()]
    assert preambles == []
    bench = {f"bench.{f.stem}": f for f in (ROOT / "bench").glob("*.py")}
    graph = import_graph(bench, roots=("bench.",))
    assert {m: sorted(t) for m, t in graph.items() if t - {"bench.common"}} == {}


def test_recipe_is_short_and_no_module_is_huge():
    assert len((PKG / "recipes" / "grpo.py").read_text().splitlines()) <= 400
    big = {str(f.relative_to(ROOT)): n for f in PKG.rglob("*.py") if (n := len(f.read_text().splitlines())) > 800}
    assert big == {}


def long_functions(files, limit: int = 100) -> dict[str, int]:
    """``path:function`` -> lines (docstring included) of every function or method over ``limit`` lines."""
    out = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= limit:
                name = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name
                out[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_long_function_finder_counts_lines(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(99))  # def line + 99 = 100 lines; + return = 101
    (tmp_path / "m.py").write_text(f"def ok():\n{body}\n\n\ndef long():\n{body}\n    return 0\n")
    assert long_functions([tmp_path / "m.py"]) == {"m.py:long": 101}


def test_no_function_in_the_product_is_over_100_lines():
    # issue 76 item 8: the core's steps read top to bottom (the GPU scripts in bench/ may run longer)
    files = [f for d in ("rlkit", "envs", "rewards", "launchers", "hydra_plugins") for f in (ROOT / d).rglob("*.py")]
    assert long_functions(files + [ROOT / "train.py"]) == {}


def test_removed_levers_stay_out_of_the_core():
    removed = yaml.safe_load((ROOT / "conf" / "compat.yaml").read_text())["removed"]
    names = {k.rsplit(".", 1)[1] for k in removed}
    assert {"screening_samples", "decoupled_loss", "mask_unexecuted", "route_coef", "route_context"} <= names
    pattern = re.compile("|".join(sorted(map(re.escape, names))))
    hits = [f"{f.relative_to(ROOT)}:{i}" for f in PKG.rglob("*.py")
            for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
