"""rlkit/ knows no env: nothing in the core imports envs/ or names one of its modules in code."""

import ast
from pathlib import Path

RLKIT = Path(__file__).resolve().parents[2] / "rlkit"


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
    files = sorted(RLKIT.rglob("*.py"))
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
