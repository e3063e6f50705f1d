"""Tokens for both servers (issue 26): a weak one is refused in one line, one from ``$GPUDASH_TOKEN`` is
never printed, and every answer says ``Referrer-Policy: no-referrer`` and which pages may frame it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from helpers.hostile_cases import healthy

from gpudash.cli import main as cli
from gpudash.commands import serve as serve_command
from gpudash.errors import UserError
from gpudash.server import app as app_module
from gpudash.server.access import FRAME_ANCESTORS, security_headers

SECRET = "env-secret-0123456789abcdef"


def _serve(runs: Path, monkeypatch: pytest.MonkeyPatch, **flags: object) -> None:
    """``gpudash serve`` until its first sleep (then stopped as by Ctrl-C)."""
    def stop(_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_command.time, "sleep", stop)
    args = argparse.Namespace(runs_dir=runs, host="127.0.0.1", port=0, token=None, allow_host=[], metrics=False)
    for k, v in flags.items():
        setattr(args, k, v)
    with pytest.raises(KeyboardInterrupt):
        serve_command.run(args)


def test_env_token_never_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    healthy(tmp_path / "runs" / "a")
    monkeypatch.setenv("GPUDASH_TOKEN", SECRET)
    _serve(tmp_path / "runs", monkeypatch, host="0.0.0.0")
    out = capsys.readouterr().out
    assert "serving" in out and SECRET not in out and "?token=$GPUDASH_TOKEN" in out


@pytest.mark.parametrize("weak", [" ", "\t \n", "sixteen-minus-1"])
def test_weak_tokens_refused_by_serve(tmp_path: Path, weak: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "runs").mkdir()
    monkeypatch.delenv("GPUDASH_TOKEN", raising=False)
    assert cli(["serve", str(tmp_path / "runs"), "--host", "0.0.0.0", "--port", "0", "--token", weak]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and ("characters" in err or "whitespace" in err), err
    monkeypatch.setenv("GPUDASH_TOKEN", weak)
    with pytest.raises(UserError, match="GPUDASH_TOKEN"):
        _serve(tmp_path / "runs", monkeypatch, host="0.0.0.0")


def test_dashboard_answers_carry_the_headers(tmp_path: Path) -> None:
    healthy(tmp_path / "runs" / "a")
    client = app_module.create_app(tmp_path / "runs").server.test_client()
    for url, status in (("/api/runs", 200), ("/", 200), ("/api/nope", 404)):
        resp = client.get(url)
        assert resp.status_code == status
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        assert resp.headers["Content-Security-Policy"] == dict(security_headers())["Content-Security-Policy"]
    refused = client.get("/", headers={"Host": "evil.example"})
    assert refused.status_code == 403 and refused.headers["Referrer-Policy"] == "no-referrer"


def test_frame_ancestors_let_the_notebook_embed() -> None:
    """The notebook's IFrame: the loopback server inside a local Jupyter page, or the same origin through
    Jupyter's proxy (gpudash.server.notebook); nothing else may frame the dashboard."""
    csp = dict(security_headers())["Content-Security-Policy"]
    sources = csp.removeprefix("frame-ancestors ").split()
    assert "'self'" in sources and "http://127.0.0.1:*" in sources and "http://localhost:*" in sources
    assert "*" not in sources and not any(s.startswith("https://*") for s in sources)
    assert tuple(sources) == FRAME_ANCESTORS
