"""rlkit/ knows no env: nothing in the core imports envs/ or names one of its modules in code."""

import ast
from pathlib import Path

import pytest

RLKIT = Path(__file__).resolve().parents[2] / "rlkit"



def _core_files() -> list[Path]:
    """rlkit's modules; not rlkit/_scripts/, the links through which a wheel carries the user tools of scripts/ (they
    name VisGym's keys on purpose: eval and play print mazes), which are not the core."""
    return sorted(f for f in RLKIT.rglob("*.py") if "_scripts" not in f.relative_to(RLKIT).parts)

def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_module_under_rlkit_imports_or_names_an_env():
    offenders = []
    files = _core_files()
    assert len(files) > 20
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                names = [node.value] if node.value.startswith("envs.") or "envs.visgym" in node.value else []
            else:
                names = []
            for name in names:
                if name == "envs" or name.startswith("envs."):
                    offenders.append(f"{path.relative_to(RLKIT.parent)}:{node.lineno}: {name}")
    assert offenders == [], "the core must reach envs only through rlkit.types interfaces:\n" + "\n".join(offenders)


#: Keys and values only VisGym's config has (conf/env/visgym*.yaml, envs/visgym/: its grounding task names,
#: its answer formats); the core reads an env through rlkit.types, so none of them belongs in its code.
VISGYM_NAMES = {"variant", "parser", "cell_size", "impl", "wall_move", "holdout", "walls", "plan_walls", "wall_bits",
                "train_room_endpoints", "train_open_passage", "route_context"}


def _visgym_names_in_code() -> list[str]:
    found = []
    for path in _core_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            # a key or value as code reads it (a string constant that is one of them), not prose in a message
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and node.value.removeprefix("env.") in VISGYM_NAMES):
                found.append(f"{path.relative_to(RLKIT.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_under_rlkit_reads_a_visgym_key_or_value():
    offenders = _visgym_names_in_code()
    assert offenders == [], "the core names VisGym's own keys or values:\n" + "\n".join(offenders)
