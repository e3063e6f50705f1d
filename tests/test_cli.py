"""The command line as a user meets it: bad flags are one line; serve --metrics scrapes; a busy port
is one line (or, where gpudash picks another, says which); output into a closed pipe ends quietly."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.server.app import serve_in_thread


@pytest.mark.parametrize("argv", [["train", "--bogus"], ["info"], ["serve", "--port", "x"], ["nosuchcommand"]])
def test_bad_flags_are_one_line(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "gpudash", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudash: error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_serve_with_metrics_exposes_prometheus(tmp_path: Path, train_tiny: Any) -> None:
    train_tiny(tmp_path / "exp1", steps=5)
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0, metrics=True)
    try:
        text = urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30).read().decode()
    finally:
        stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    step = families["gpudash_step"].samples
    assert any(s.labels.get("run") == "exp1" and s.labels.get("rank") == "0" for s in step)
    assert "gpudash_memory_category_bytes" in families


def _gpudash_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GPUDASH_DEBUG"}


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process (here: this one) is listening on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_serve_on_a_busy_port_is_one_gpudash_line(tmp_path: Path, busy_port: int) -> None:
    out = subprocess.run([sys.executable, "-m", "gpudash", "serve", str(tmp_path), "--port", str(busy_port)],
                         capture_output=True, text=True, timeout=120, env=_gpudash_env())
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudash: error: "), out.stderr
    assert f"port {busy_port} is busy" in lines[0] and "--port" in lines[0] and "stop the other process" in lines[0]
    assert "Werkzeug" not in out.stderr and "in use by another program" not in out.stderr


def test_run_serve_on_a_busy_port_says_which_port_it_chose(tmp_path: Path, busy_port: int) -> None:
    out = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "r"), "--serve",
                          "--port", str(busy_port), "--", sys.executable, "-c", "pass"],
                         capture_output=True, text=True, timeout=120, env=_gpudash_env())
    assert out.returncode == 0, out.stderr
    chosen = re.search(rf"gpudash: port {busy_port} is busy; dashboard on http://127\.0\.0\.1:(\d+)/", out.stderr)
    assert chosen and int(chosen.group(1)) != busy_port, out.stderr


@pytest.fixture(scope="module")
def a_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpudash.monitor import Monitor
    from gpudash.testing import ToyLoop

    path = tmp_path_factory.mktemp("pipe") / "run"
    with Monitor(path, host_hz=0) as mon:
        ToyLoop().train(mon, 3)
    return path


PRINTERS = [["estimate", "--preset", "llama-7b", "--seq-len", "2048", "--card-gb", "24", "--json"],
            ["estimate", "--preset", "llama-7b", "--seq-len", "2048", "--card-gb", "24"],
            ["info", "RUN", "--json"], ["info", "RUN"], ["report", "RUN", "--format", "md"],
            ["report", "RUN", "--format", "json"]]


@pytest.mark.parametrize("argv", PRINTERS, ids=" ".join)
def test_output_into_a_closed_pipe_ends_quietly(argv: list[str], a_run: Path) -> None:
    argv = [str(a_run) if a == "RUN" else a for a in argv]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written: every write meets a closed pipe
    try:
        out = subprocess.run([sys.executable, "-m", "gpudash", *argv], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=120, env=_gpudash_env())
    finally:
        os.close(write)
    assert out.stderr == "" and out.returncode == 141


def test_head_of_estimate_json(tmp_path: Path) -> None:
    cmd = f"{shlex.quote(sys.executable)} -m gpudash estimate --preset llama-7b --card-gb 24 --json | head -1"
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120, env=_gpudash_env())
    assert out.stdout == "{\n" and out.stderr == "" and out.returncode == 0


def test_a_busy_metrics_port_does_not_end_the_training_process(tmp_path: Path, busy_port: int) -> None:
    # werkzeug used to print its own lines and sys.exit(1) from inside the training process
    import gpudash
    from gpudash.monitor import Monitor
    from gpudash.server.metrics import MetricsServer
    from gpudash.testing import ToyLoop

    with Monitor(tmp_path / "m", host_hz=0) as mon:
        mon.add_collector(MetricsServer(port=busy_port))
        ToyLoop().train(mon, 2)
    run = gpudash.load_run(tmp_path / "m")
    assert len(run.steps) == 2
    said = run.events[run.events["kind"] == "collector_unavailable"]["message"].tolist()
    assert any(m.startswith("metrics: failed to start") for m in said), said
    run.close()


@pytest.mark.parametrize("command", ["serve", "demo", "run"])
def test_one_set_of_server_flags(command: str) -> None:
    """serve, demo and run --serve take the same --host/--port/--token/--allow-host, port default DEFAULT_PORT."""
    from gpudash.cli import build_parser
    from gpudash.options import DEFAULT_PORT

    args = build_parser(command).parse_args([command])
    assert (args.host, args.port, args.token, args.allow_host) == ("127.0.0.1", DEFAULT_PORT, None, [])
    args = build_parser(command).parse_args([command, "--host", "::1", "--port", "0", "--token", "t" * 24,
                                             "--allow-host", "a.example", "--allow-host", "b.example"])
    assert (args.host, args.port, args.token, args.allow_host) == ("::1", 0, "t" * 24, ["a.example", "b.example"])


@pytest.mark.parametrize("argv", [["serve", "--port", "70000"], ["demo", "--port", "-1"],
                                  ["run", "--serve", "--port", "99999", "--", "true"]])
def test_a_port_out_of_range_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--port" in err[0] and "between 1 and 65535" in err[0], err


def test_run_serve_beyond_loopback_needs_a_token_before_the_job_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "r"), "--serve",
                          "--host", "0.0.0.0", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in _gpudash_env().items() if k != "GPUDASH_TOKEN"})
    assert out.returncode == 2 and not marker.exists(), out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("gpudash: error:")]
    assert len(errors) == 1 and "--token" in errors[0], out.stderr
