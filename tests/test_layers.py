"""DESIGN.md layers: imports only point down. Checks every import, including
ones inside functions, which a module-level lint would miss."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "gpudash"
RULES = {
    "layouts": {"torch", "pynvml"},
    "analysis": {"torch", "pynvml", "dash"},
    "store": {"torch", "pynvml", "dash", "plotly"},
    "collectors": {"dash", "plotly"},
    "trainer": {"dash", "plotly"},
    "integrations": {"dash", "plotly"},
    "monitor.py": {"dash", "plotly"},
}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_layers_are_honest() -> None:
    bad = []
    for part, banned in RULES.items():
        target = PKG / part
        files = [target] if target.is_file() else sorted(target.rglob("*.py"))
        for f in files:
            hit = _imports(f) & banned
            if hit:
                bad.append(f"{f.relative_to(PKG.parent)} imports {sorted(hit)}")
    assert not bad, "\n".join(bad)
