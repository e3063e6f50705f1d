"""No module reaches into another gpudash module's private names (issue 47: "no private attribute crossed
between modules"): a ``_name`` defined in one module's classes is read or written only there, and no module
imports another's ``_name``. Private names of other libraries (``torch._C``, ``argparse._ArgumentGroup``) are
not ours to rename and are left to the code that needs them."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "gpudash"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _class_privates(tree: ast.AST) -> set[str]:
    """Private names a module's classes define: methods, class attributes, ``self._x = ...``."""
    out: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for n in ast.walk(cls):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(n.name):
                out.add(n.name)
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                  and n.value.id in ("self", "cls") and _private(n.attr)):
                out.add(n.attr)
        for n in cls.body:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            out.update(t.id for t in targets if isinstance(t, ast.Name) and _private(t.id))
    return out


def _foreign(tree: ast.AST, package: str) -> set[str]:
    """Names a module binds to other libraries (``import torch``, ``from torch import cuda``)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in n.names if not a.name.startswith(package))
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and not (n.module or "").startswith(package):
            out.update(a.asname or a.name for a in n.names)
    return out


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def crossings(root: Path) -> list[str]:
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(root.rglob("*.py"))}
    owners: dict[str, set[Path]] = defaultdict(set)
    for p, tree in trees.items():
        for name in _class_privates(tree):
            owners[name].add(p)
    found: list[str] = []
    for p, tree in trees.items():
        rel = p.relative_to(root.parent)
        foreign = _foreign(tree, root.name) | {"torch"}  # a collector's lazily imported torch is torch too
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(root.name):
                found += [f"{rel}:{n.lineno}: imports {n.module}.{a.name}" for a in n.names if _private(a.name)]
            if (isinstance(n, ast.Attribute) and _private(n.attr) and n.attr in owners and p not in owners[n.attr]
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                    and _root(n.value) not in foreign):
                where = ", ".join(str(o.relative_to(root.parent)) for o in sorted(owners[n.attr]))
                found.append(f"{rel}:{n.lineno}: reaches .{n.attr} (private to {where})")
    return found


def test_no_module_reaches_into_another_modules_private_names() -> None:
    assert crossings(PKG) == []


def test_the_finder_sees_a_private_attribute_and_a_private_import(tmp_path: Path) -> None:
    pkg = tmp_path / "gpudash"
    pkg.mkdir()
    (pkg / "a.py").write_text("class A:\n    def __init__(self):\n        self._n = 1\n    def _go(self):\n"
                              "        return self._n\n_HELPER = 1\n")
    (pkg / "b.py").write_text("from gpudash.a import A, _HELPER\nimport torch\n\ndef f(a: A):\n"
                              "    torch._C\n    return a._n + a._go()\n")
    found = crossings(pkg)
    assert any("imports gpudash.a._HELPER" in f for f in found)
    assert any("reaches ._n" in f for f in found) and any("reaches ._go" in f for f in found)
    assert len([f for f in found if "._go" in f]) == 1  # torch.cuda.memory._go is another library's
