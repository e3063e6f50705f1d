"""examples/notebook.ipynb on a kernel of a real Jupyter Server with ``base_url=/user/alice/`` and
jupyter-server-proxy (a JupyterHub user server): the IFrame goes through Jupyter's proxy, and headless
Chromium, reaching Jupyter by a name that is not loopback, sees the run page and its live steps there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import make_driver, need_chromium, wait_for
from helpers.components import free_port

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("jupyter_server")
pytest.importorskip("jupyter_server_proxy")
pytest.importorskip("ipykernel")
pytest.importorskip("selenium")

from jupyter_client import BlockingKernelClient  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
BASE = "/user/alice/"
HUB_NAME = "hub.gpudash.test"  # how the browser names the Jupyter server (mapped to 127.0.0.1 in Chromium)
JTOKEN = "jupyter-test-token"

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _api(port: int, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{BASE}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {JTOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


@pytest.fixture
def jupyter(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A Jupyter Server at 127.0.0.1:PORT/user/alice/ with jupyter-server-proxy; its kernels run this
    interpreter. Yields (port, runtime dir)."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gpudash test)", "language": "python"}))
    runtime, work = tmp_path / "runtime", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUDASH_PROXY_PREFIX", "JUPYTERHUB_SERVICE_PREFIX")}
    env.update(JUPYTER_PATH=str(tmp_path / "jupyter"), JUPYTER_RUNTIME_DIR=str(runtime), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(NOTEBOOK.parents[1]), env.get("PYTHONPATH", "")]))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--ServerApp.base_url={BASE}", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0", "--ServerApp.open_browser=False",
         "--ServerApp.allow_remote_access=True", "--allow-root", f"--ServerApp.root_dir={work}",
         f"--IdentityProvider.token={JTOKEN}", "--ServerApp.jpserver_extensions={'jupyter_server_proxy': True}"],
        env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=(tmp_path / "jupyter.log").open("w"))
    try:
        for _ in range(300):
            try:
                _api(port, "api/status")
                break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.2)
        else:
            pytest.fail("jupyter server did not start")
        assert proc.poll() is None, (tmp_path / "jupyter.log").read_text()[-3000:]
        yield port, runtime
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _run(kc: BlockingKernelClient, code: str) -> list[dict[str, Any]]:
    """Execute ``code`` on the kernel; its outputs (fails on an error)."""
    outputs: list[dict[str, Any]] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] in ("display_data", "execute_result", "stream", "error"):
            outputs.append({"type": msg["msg_type"], **msg["content"]})

    reply = kc.execute_interactive(code, output_hook=hook, timeout=240)
    errors = [o for o in outputs if o["type"] == "error"]
    assert reply["content"]["status"] == "ok" and not errors, "\n".join(errors[0]["traceback"]) if errors else reply
    return outputs


def test_notebook_dashboard_through_the_jupyter_proxy(jupyter: tuple[int, Path]) -> None:
    need_chromium()
    port, runtime = jupyter
    kernel = _api(port, "api/kernels", "POST", {"name": "python3"})
    kc = BlockingKernelClient()
    kc.load_connection_file(str(runtime / f"kernel-{kernel['id']}.json"))
    kc.start_channels()
    driver = None
    try:
        kc.wait_for_ready(timeout=120)
        code = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
        train_at = next(i for i, src in enumerate(code) if "monitor.step(" in src)
        shown: list[dict[str, Any]] = []
        for src in code[:train_at]:
            shown += _run(kc, src)
        html = "".join(o.get("data", {}).get("text/html", "") for o in shown)
        src = re.search(r'<iframe src="([^"]+)"', html)
        assert src, html
        url = src.group(1).replace("&amp;", "&")
        # inferred from the server that runs the kernel: its base_url, its proxy, a token for the page
        assert re.fullmatch(rf"{BASE}proxy/\d+/run/notebook-[\d-]+\?token=[\w-]+", url), url
        dash_port = int(url.split("/proxy/")[1].split("/")[0])
        assert f"ssh -L {dash_port}:127.0.0.1:{dash_port}" in html  # the "not reachable?" line

        driver = make_driver(1400, 1000, f"--host-resolver-rules=MAP {HUB_NAME} 127.0.0.1")
        hub = f"http://{HUB_NAME}:{port}"
        driver.get(f"{hub}{BASE}api/status?token={JTOKEN}")  # log in to Jupyter (its cookie)
        driver.get(hub + url)  # as the IFrame does, relative to the notebook page's origin
        wait_for(lambda: driver.find_element("id", "run-name").text, 60, "the run page through the proxy")
        assert driver.current_url.startswith(f"{hub}{BASE}proxy/{dash_port}/run/notebook-")
        assert "token=" not in driver.current_url  # moved into the cookie
        assert driver.find_element("id", "run-status").text == "live"
        msg_id = kc.execute(code[train_at])  # the training cell; the page above keeps polling through the proxy

        def live_step() -> bool:  # a step number on the page while the run is still live
            status, step = (driver.find_element("id", i).text.strip() for i in ("run-status", "last-step"))
            return status == "live" and step.isdigit() and int(step) < 199

        wait_for(live_step, 120, "a live step")
        # the closed run: its last step arrives with the tick after the one that sees it finished
        wait_for(lambda: driver.find_element("id", "run-status").text == "finished"
              and driver.find_element("id", "last-step").text == "199", 240, "the run's last step, finished")
        out = ""
        while True:  # the cell's own check: the dashboard answered (from the kernel's machine) while training
            msg = kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            assert msg["msg_type"] != "error", msg["content"]
            out += msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert "dashboard answered HTTP 200 at step 100 while training" in out, out
    finally:
        if driver is not None:
            driver.quit()
        kc.stop_channels()
