"""``gpudash report --format md`` carries no raw HTML from a run's name, events or end reason."""

from __future__ import annotations

from pathlib import Path

from gpudash.report import md_text, render_markdown


def test_markdown_escapes_markup_from_the_run(tmp_path: Path) -> None:
    import gpudash
    from gpudash.monitor import Monitor

    evil = '<a href="javascript:alert(1)">x</a> &amp; <img src=x onerror=alert(1)>'
    with Monitor(tmp_path / "evil", name=evil, host_hz=0, handle_signals=False) as mon:
        for _ in range(3):
            with mon.step(samples=1):
                pass
        mon.event("oom", evil, requested_bytes=1)
    md = render_markdown(gpudash.load_run(tmp_path / "evil"))
    assert "<a " not in md and "<img" not in md and "</a>" not in md
    assert "&lt;a href=" in md and "&amp;amp;" in md


def test_markdown_keeps_plain_comparisons_readable() -> None:
    assert md_text("loss < 2 and a<b, x > y, R&D") == "loss < 2 and a&lt;b, x > y, R&D"
    assert md_text("<!-- c --> </p> &#60; &lt;") == "&lt;!-- c --> &lt;/p> &amp;#60; &amp;lt;"
