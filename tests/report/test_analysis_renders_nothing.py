"""analysis/ derives facts; it renders none of them (issue 25): no module there imports a renderer's
library or holds HTML or Markdown markup, and none reaches gpudash.report (the report sits above it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "gpudash"
MARKUP = re.compile(r"<(!DOCTYPE|html|div|span|svg|table|tr|td|ul|ol|li|b|h[1-6]|p|section|figure)\b"
                    r"|^#{1,4} |\*\*\w", re.I | re.M)


def _literal(node: ast.AST) -> str | None:
    """A string constant, or an f-string with each placeholder read as ``x``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)  # type: ignore[misc]
    return None


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr)}
    out = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        out += [f"imports {n}" for n in names if n.split(".")[0] in ("html", "jinja2", "markupsafe")
                or n.startswith("gpudash.report")]
        text = _literal(node)
        if text is not None and id(node) not in docstrings and MARKUP.search(text):
            out.append(f"line {getattr(node, 'lineno', '?')}: {text[:50]!r}")
    return out


def test_no_analysis_module_renders_markup() -> None:
    bad = {str(p.relative_to(PKG)): o for p in sorted((PKG / "analysis").rglob("*.py")) if (o := _offences(p))}
    assert bad == {}


@pytest.mark.parametrize("source", ['x = "<li>" + y', 'import html', 'from gpudash.report import page',
                                    'x = f"- **{k}**: {v}"', 'x = "### " + t'])
def test_the_check_sees_markup_and_renderer_imports(tmp_path: Path, source: str) -> None:
    f = tmp_path / "m.py"
    f.write_text(f'"""A docstring may say <b>, **bold** and ## anything."""\n{source}\n')
    assert _offences(f)
    f.write_text('"""A docstring may say <b>, **bold** and ## anything."""\nx = "loss < 2 and a ** b"\n')
    assert not _offences(f)
