"""Secrets are never recorded (issue 44, item 1): a webhook URL, a token flag, a credential in a config or
an environment assignment is redacted in ``run.json`` (argv) and the rank database's meta (argv, config),
shown as ``https://hooks.slack.com/…`` with a note; a ``user:pass@`` webhook is refused in one line."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.cli import main
from gpudash.store.redact import redact_meta, secret_name

SECRET = "T0kenZZsecret4242"
HOOK = f"https://hooks.slack.com/services/T000/B000/{SECRET}"


def _all_bytes(run: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file())


def _meta(run: Path) -> dict[str, object]:
    with sqlite3.connect(run / "rank0.db") as c:
        return {k: json.loads(v) for k, v in c.execute("SELECT key, value FROM meta")}


def test_train_records_no_webhook_and_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    argv = ["train", "--steps", "2", "--batch", "2", "--seq-len", "16", "--device", "cpu", "--no-progress",
            "--host-hz", "0", "--run-dir", str(run), "--alert-webhook", HOOK, "--alert", "desktop=false"]
    # as the command line would have it, with more credentials than the trainer takes
    monkeypatch.setattr(sys, "argv", ["gpudash", *argv, f"--hub-token={SECRET}", f"WANDB_API_KEY={SECRET}"])
    assert main(argv) == 0
    capsys.readouterr()
    assert SECRET.encode() not in _all_bytes(run)  # nowhere: run.json, the database, segments
    run_json = json.loads((run / "run.json").read_text())
    assert "https://hooks.slack.com/…" in run_json["argv"]
    assert "--hub-token=…" in run_json["argv"]
    assert any("--alert-webhook" in n for n in run_json["redacted"])  # the note: what was redacted
    meta = _meta(run)
    assert "https://hooks.slack.com/…" in meta["argv"]  # type: ignore[operator]
    assert "hooks.slack.com/…" in json.dumps(meta["config"], ensure_ascii=False) and meta["redacted"]


def test_a_config_and_environment_assignments_are_redacted() -> None:
    meta = {"argv": ["train.py", "--api-key", "abc123", "--lr", "0.1", "--webhook=http://10.0.0.1/x/y",
                     f"--note=see https://u:{SECRET}@git.example.com/repo", "--max-tokens", "5"],
            "config": {"db": {"password": "hunter2", "host": "db"}, "aws_secret_access_key": "AKxx",
                       "url": f"https://example.com/x?token={SECRET}", "gh": f"ghp_{'a' * 36}",
                       "alerts": {"webhook": None}, "max_new_tokens": 128, "tokenizer": "gpt2"}}
    out = redact_meta(meta)
    text = json.dumps(out, ensure_ascii=False)
    for secret in ("abc123", "hunter2", "AKxx", SECRET, "ghp_aaaa", "10.0.0.1/x"):
        assert secret not in text, secret
    assert out["argv"][:5] == ["train.py", "--api-key", "…", "--lr", "0.1"]
    assert out["argv"][5] == "--webhook=http://10.0.0.1/…" and out["argv"][6:] == [
        "--note=see https://git.example.com/…", "--max-tokens", "5"]
    assert out["config"]["max_new_tokens"] == 128 and out["config"]["tokenizer"] == "gpt2"
    assert out["config"]["db"]["host"] == "db" and out["config"]["alerts"] == {"webhook": None}
    assert len(out["redacted"]) == 7
    assert secret_name("HF_TOKEN") and secret_name("secretAccessKey") and not secret_name("max_tokens")
    assert not secret_name("webhook_last_error") and not secret_name("webhook_sent")  # the alerts' own counts


def test_a_user_password_webhook_is_refused_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUDASH_DEBUG"}
    for cmd in (["train", "--steps", "1", "--run-dir", str(tmp_path / "r")], ["serve", str(tmp_path)]):
        out = subprocess.run([sys.executable, "-m", "gpudash", *cmd, "--alert-webhook",
                              f"http://user:{SECRET}@hooks.example.com/services/T/B/X"],
                             capture_output=True, text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 2, out.stderr[-2000:]
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "user:password@" in lines[0] and "Traceback" not in out.stderr, out.stderr
        assert SECRET not in out.stderr  # the refusal does not print the password either
    assert not (tmp_path / "r").exists()


def test_a_run_recorded_with_a_secret_shows_none(tmp_path: Path) -> None:
    """A run written before redaction (or by another tool): every surface reads its meta redacted."""
    from helpers.hostile_cases import healthy

    from gpudash.store import load_run

    run = healthy(tmp_path / "old")
    (run / "run.json").write_text(json.dumps({"name": "old", "argv": ["train", "--alert-webhook", HOOK]}))
    with sqlite3.connect(run / "rank0.db") as c:
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('config', ?)",
                  (json.dumps({"alerts": {"webhook": HOOK}}),))
    c.close()
    r = load_run(run)
    try:
        assert SECRET not in json.dumps(r.meta, default=str)
        assert "https://hooks.slack.com/…" in json.dumps(r.meta, ensure_ascii=False)
    finally:
        r.close()
