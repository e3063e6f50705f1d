"""benchmarks/RESULTS.md: each benchmark owns one ``## `` section and replaces only that."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def write_section(title: str, text: str, path: Path = RESULTS) -> None:
    """Replace the section that starts with ``title`` (a ``## `` heading), or append it."""
    current = path.read_text() if path.exists() else "# Benchmark results\n"
    block = text.rstrip("\n") + "\n"
    start = current.find(title)
    if start < 0:
        new = current.rstrip("\n") + "\n\n" + block
    else:
        nxt = current.find("\n## ", start + len(title))
        new = current[:start] + block + ("\n" + current[nxt + 1:] if nxt >= 0 else "")
    path.write_text(new)
