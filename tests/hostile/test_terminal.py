"""Recorded text never acts on the terminal (issue 44, item 6): a run name, an event kind, a problem or a
path holding escape sequences (title change, screen clear, OSC-8 link, a fake line) is printed escaped by
``gpudash info``, ``gpudash check`` and the one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.hostile_cases import healthy

from gpudash.cli import main
from gpudash.store.writer import Recorder
from gpudash.terminal import printable

EVIL = "run\x1b]0;pwned\x07\x1b[2J\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\rfake\nline\u202eexe.txt\x9b"


def test_printable_escapes_every_control() -> None:
    out = printable(EVIL)
    assert out.isprintable() and "\\x1b]0;pwned\\x07" in out and "\\n" in out and "\\u202e" in out
    assert "\\x9b" in out and printable("plain – text ✓") == "plain – text ✓"


def test_info_prints_a_hostile_run_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = healthy(tmp_path / "r", name=EVIL)
    rec = Recorder(run, flush_interval=60)
    rec.put("events", {"time": 1e9, "step": 1, "kind": "oops\x1b[31m", "message": "m\x1b[2J", "data": None})
    rec.close()
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out and "\x9b" not in out
    assert "run\\x1b]0;pwned\\x07" in out and "oops\\x1b[31m x1" in out
    assert all(line.isprintable() for line in out.splitlines())


def test_errors_and_check_lines_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path / "no\x1b[2Jthere")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "no\\x1b[2Jthere" in err
    run = healthy(tmp_path / "ok\x1b]0;t\x07")
    assert main(["check", str(run), "--no-oom"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: 1 rule(s) hold for ") and "\x1b" not in out and "\\x1b]0;t\\x07" in out
