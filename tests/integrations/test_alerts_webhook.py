"""Alerts delivered: a real HTTP receiver on 127.0.0.1, a real training loop under the Monitor, the trainer's
``--alert-webhook`` and ``gpudash serve``'s watcher over a run another process writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpudash.alerts.delivery import Delivery, WebhookSender, alert_payload
from gpudash.analysis.alerts import Alert
from gpudash.options import AlertOptions
from gpudash.store import load_run

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """An http.server on 127.0.0.1 that keeps every JSON body posted to it (``mode``: ok, fail, hang)."""

    def __init__(self, mode: str = "ok") -> None:
        self.bodies: list[dict[str, Any]] = []
        self.attempts = 0
        self.got = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.attempts += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if mode == "hang":
                    outer.release.wait(30)
                    return
                if mode == "fail":
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.bodies.append(json.loads(body))
                outer.got.set()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _opts(url: str, **kw: Any) -> AlertOptions:
    return AlertOptions(webhook=url, desktop=False, terminal=False, **kw)


def test_injected_nan_posts_one_alert_within_2_s_of_the_step(tmp_path: Path, receiver: Receiver) -> None:
    from gpudash.monitor import Monitor

    mon = Monitor(tmp_path / "nan-run", host_hz=0, alerts=_opts(receiver.url), handle_signals=False)
    for i in range(30):
        with mon.step(samples=4):
            time.sleep(0.005)
            mon.log(loss=float("nan") if i == 20 else 2.0)
        if i == 20:
            stepped = time.monotonic()
            assert receiver.got.wait(2.0), "no alert within 2 s of the NaN step"
            assert time.monotonic() - stepped <= 2.0
    time.sleep(0.2)
    mon.close()
    assert len(receiver.bodies) == 1  # one episode, one alert (the NaN step repeats in every later look)
    body = receiver.bodies[0]
    assert (body["run"], body["step"], body["kind"]) == ("nan-run", 20, "nonfinite")
    assert body["message"] == "loss is non-finite (NaN/Inf) at step 20"
    assert body["link"] == "http://127.0.0.1:8050/run/nan-run"
    assert body["content"] == "gpudash [nan-run] step 20: loss is non-finite (NaN/Inf) at step 20 " + body["link"]
    assert body["text"] == ("gpudash [nan-run] step 20: loss is non-finite (NaN/Inf) at step 20 "
                            f"<{body['link']}|run page>")  # Slack's link syntax
    # the run holds it: the dashboard's events and the report read it from there
    run = load_run(tmp_path / "nan-run")
    alerts = run.events[run.events["kind"] == "alert"]
    assert alerts["message"].tolist() == ["loss is non-finite (NaN/Inf) at step 20"]
    assert run.meta["alerts"]["webhook_sent"] == 1 and run.meta["alerts"]["webhook_dropped"] == 0
    run.close()


def test_a_crash_alerts_with_its_reason(tmp_path: Path, receiver: Receiver) -> None:
    from gpudash.monitor import Monitor

    with pytest.raises(RuntimeError), Monitor(tmp_path / "boom", host_hz=0, alerts=_opts(receiver.url),
                                              handle_signals=False) as mon:
        for i in range(5):
            with mon.step():
                mon.log(loss=2.0)
            if i == 4:
                raise RuntimeError("data loader died")
    kinds = [b["kind"] for b in receiver.bodies]
    assert kinds == ["crashed"], kinds
    assert "RuntimeError: data loader died" in receiver.bodies[0]["message"]
    run = load_run(tmp_path / "boom")
    assert "crashed" in run.events.loc[run.events["kind"] == "alert", "message"].iloc[0]
    run.close()


def test_a_stalled_loop_alerts_from_the_watcher_thread(tmp_path: Path, receiver: Receiver) -> None:
    from gpudash.monitor import Monitor

    mon = Monitor(tmp_path / "stall", host_hz=0, handle_signals=False,
                  alerts=_opts(receiver.url, stall_factor=5, stall_min_s=1.0, poll_s=0.2))
    for _ in range(20):
        with mon.step():
            time.sleep(0.01)
            mon.log(loss=2.0)
    assert receiver.got.wait(5.0), "no stall alert while the loop hung"  # the loop "hangs" here
    with mon.step():
        mon.log(loss=2.0)
    mon.close()
    assert [(b["kind"], b["step"]) for b in receiver.bodies] == [("stall", 19)]
    assert receiver.bodies[0]["message"].startswith("no step for ")


def test_slack_text_escapes_the_runs_own_text() -> None:
    body = alert_payload("r<x>", Alert("oom", "Tried <@channel> & more", step=1), "http://h/run/r")
    assert body["text"] == "gpudash [r&lt;x&gt;] step 1: Tried &lt;@channel&gt; &amp; more <http://h/run/r|run page>"
    assert body["content"] == "gpudash [r<x>] step 1: Tried <@channel> & more http://h/run/r"
    assert body["message"] == "Tried <@channel> & more"


def test_a_hanging_receiver_never_blocks_and_a_full_queue_is_counted() -> None:
    hang = Receiver("hang")
    try:
        sender = WebhookSender(hang.url, timeout_s=0.5, retries=0, queue_size=2)
        alert = Alert("nonfinite", "x", step=1)
        for _ in range(10):  # returns at once each time: the queue takes two, the rest are dropped
            sender.send(alert_payload("r", alert, None))
        assert sender.dropped >= 7
        sender.close(1.0)
    finally:
        hang.close()


def test_a_failing_receiver_is_retried_then_dropped_and_counted() -> None:
    fail = Receiver("fail")
    try:
        d = Delivery(_opts(fail.url, retries=2))
        d.deliver("r", Alert("oom", "CUDA out of memory", step=3), None)
        deadline = time.monotonic() + 10
        while d.webhook is not None and d.webhook.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fail.attempts == 3
        assert d.stats()["webhook_dropped"] == 1 and d.stats()["webhook_last_error"] == "HTTP 503"
        d.close(1.0)
    finally:
        fail.close()


def test_terminal_line_and_desktop_said_once(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    d = Delivery(AlertOptions(desktop=True, terminal=True))
    d.deliver("r", Alert("stall", "no step for 70 s", step=9), None)
    d.deliver("r", Alert("oom", "out of memory", step=10), None)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "gpudash: alert [r] step 9: no step for 70 s"
    assert sum("desktop notifications are not available" in line for line in err) == 1
    d.close(0.5)


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gpudash", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_bad_webhook_urls_are_one_line_errors(tmp_path: Path) -> None:
    for cmd in (["train", "--steps", "1"], ["serve", str(tmp_path)], ["run"]):
        tail = ["--", sys.executable, "-c", "pass"] if cmd == ["run"] else []
        p = _cli(*cmd, "--alert-webhook", "ftp://example.com/hook", *tail, timeout=60)
        assert p.returncode == 2, (cmd, p.stderr)
        assert p.stderr.strip().splitlines() == [
            "gpudash: error: alert webhook 'ftp://example.com/hook': pass an http:// or https:// URL (e.g. a Slack "
            "or Discord incoming-webhook URL)"]
    p = _cli("train", "--steps", "1", "--alert", "cooldown=5", timeout=60)
    assert p.returncode == 2 and "--alert 'cooldown=5': expected KEY=VALUE" in p.stderr


def test_gpudash_train_alert_webhook(tmp_path: Path, receiver: Receiver) -> None:
    p = _cli("train", "--preset", "tiny", "--steps", "30", "--batch", "2", "--seq-len", "32", "--no-progress",
             "--inject-nan-at-step", "22", "--run-dir", str(tmp_path / "t"), "--alert-webhook", receiver.url,
             "--alert", "desktop=false")
    assert p.returncode == 0, p.stderr
    assert [b["kind"] for b in receiver.bodies] == ["nonfinite"]
    assert receiver.bodies[0]["step"] == 22
    assert "gpudash: alert [t] step 22: loss is non-finite" in p.stderr


def test_serve_watches_live_runs_another_process_writes(tmp_path: Path, receiver: Receiver) -> None:
    from gpudash.alerts.watch import ServeAlerts

    runs = tmp_path / "runs"
    script = ("import sys, time, gpudash\n"
              "m = gpudash.Monitor(sys.argv[1], host_hz=0, handle_signals=False)\n"
              "for i in range(400):\n"
              "    with m.step():\n"
              "        m.log(loss=float('nan') if i == 300 else 2.0)\n"
              "    time.sleep(0.01)\n"
              "m.close()\n")
    # a run already going (and a NaN long before the server looks) alerts nothing from its past
    old = runs / "old"
    old_script = script.replace("i == 300", "i == 5").replace("range(400)", "range(40)").replace("m.close()\n", "")
    subprocess.run([sys.executable, "-c", old_script, str(old)], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                   timeout=60)  # exits without close(): its heartbeat stops, then it reads as crashed
    child = subprocess.Popen([sys.executable, "-c", script, str(runs / "live")], env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 20
        while not (runs / "live" / "rank0.db").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        serve = ServeAlerts(runs, _opts(receiver.url, poll_s=0.2), "http://127.0.0.1:9999")
        assert child.wait(60) == 0
        deadline = time.monotonic() + 10
        while not receiver.bodies and time.monotonic() < deadline:
            time.sleep(0.05)
        serve.stop()
    finally:
        child.kill()
    assert [(b["run"], b["kind"], b["step"]) for b in receiver.bodies] == [("live", "nonfinite", 300)]
    assert receiver.bodies[0]["link"] == "http://127.0.0.1:9999/run/live"


def test_gpudash_run_alert_webhook_on_an_unchanged_script(tmp_path: Path, receiver: Receiver) -> None:
    pytest.importorskip("torch")
    script = ROOT / "examples" / "unchanged" / "train_plain.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "z"), "--alert-webhook",
                        receiver.url, "--alert", "desktop=false", "--", sys.executable, str(script), "--steps", "5",
                        "--fail-at", "2"], capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert p.returncode == 1, p.stderr  # the script's own exit code
    assert [b["kind"] for b in receiver.bodies] == ["crashed"], p.stderr
    assert receiver.bodies[0]["run"] == "z" and "exception" in receiver.bodies[0]["message"]


def test_serve_alerts_a_run_killed_with_sigkill(tmp_path: Path, receiver: Receiver) -> None:
    from gpudash.alerts.watch import ServeAlerts

    runs = tmp_path / "runs"
    script = ("import sys, time, gpudash\n"
              "m = gpudash.Monitor(sys.argv[1], host_hz=0, handle_signals=False, flush_interval=0.05)\n"
              "for i in range(100000):\n"
              "    with m.step():\n"
              "        m.log(loss=2.0)\n"
              "    time.sleep(0.01)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(runs / "doomed")],
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    serve = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (runs / "doomed" / "rank0.db").exists() and load_run(runs / "doomed").steps.shape[0] > 20:
                break
            time.sleep(0.1)
        serve = ServeAlerts(runs, _opts(receiver.url, poll_s=0.2), "http://127.0.0.1:9999")
        deadline = time.monotonic() + 10
        while "doomed" not in serve.watches and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "doomed" in serve.watches
        child.kill()  # no close(), no atexit: only a watcher outside the process can tell
        child.wait(10)
        assert receiver.got.wait(15.0)
    finally:
        child.kill()
        if serve is not None:
            serve.stop()
    assert [(b["run"], b["kind"]) for b in receiver.bodies] == [("doomed", "crashed")]
    assert "process died" in receiver.bodies[0]["message"] or "heartbeat" in receiver.bodies[0]["message"]
