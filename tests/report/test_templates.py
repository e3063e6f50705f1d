"""The report's templates ship with the package and load from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudash.report.templating import html_env, markdown_env

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "gpudash" / "report" / "templates"


def test_every_template_is_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gpudash"]
    shipped = {p for g in globs for p in (ROOT / "gpudash").glob(g)}  # what setuptools puts in the wheel
    files = {p for p in TEMPLATES.rglob("*") if p.is_file()}
    assert files and files - shipped == set()


def test_the_environments_load_the_templates_they_render() -> None:
    assert html_env().autoescape is True and markdown_env().autoescape is False
    assert {"report.html.j2", "report.md.j2", "chart.svg.j2", "report.css"} <= set(html_env().list_templates())
    for name in ("report.html.j2", "chart.svg.j2"):
        html_env().get_template(name)
    markdown_env().get_template("report.md.j2")
