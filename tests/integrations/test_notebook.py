"""Execute examples/notebook.ipynb in a real ipykernel: the inline dashboard answers while training runs."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from gpudash import load_run  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


@pytest.fixture
def python3_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``python3`` kernelspec for this interpreter, found first (JUPYTER_PATH), so the
    notebook runs with this environment's gpudash on any machine without installing one."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gpudash test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # the kernel inherits this: on a small shared CI box, multi-threaded CPU kernels
    # spin against each other and a 30 ms step takes 700 ms
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return "python3"


def _text(cell: dict) -> str:  # type: ignore[type-arg]
    return "".join(o.get("text", "") for o in cell["outputs"] if o.get("output_type") == "stream")


@pytest.mark.slow
def test_notebook_trains_with_the_dashboard_inline(tmp_path: Path, python3_kernel: str) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    work = tmp_path / "work"
    work.mkdir()
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name=python3_kernel,
                                     resources={"metadata": {"path": str(work)}})
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    show_cell = next(c for c in code if "gpudash.show(monitor" in c.source)
    html = "".join(o.get("data", {}).get("text/html", "") for o in show_cell.outputs)
    assert "<iframe" in html and "http://127.0.0.1:" in html and "/run/notebook-" in html
    out = _text(next(c for c in code if "monitor.step(" in c.source))
    assert "dashboard answered HTTP 200 at step 100 while training" in out, out
    (run_dir,) = list((work / "runs").glob("notebook-*"))
    run = load_run(run_dir)
    assert run.status == "finished" and run.ranks == [0]
    assert list(run.steps["step"]) == list(range(200))
    assert run.steps["loss"].iloc[-20:].mean() < run.steps["loss"].iloc[:20].mean()
    run.close()


def test_show_twice_reuses_the_server(tmp_path: Path, train_tiny: object) -> None:
    from gpudash.server import notebook

    train_tiny(tmp_path / "runs" / "a", steps=3, host_hz=0, handle_signals=False)  # type: ignore[operator]
    train_tiny(tmp_path / "runs" / "b", steps=3, host_hz=0, handle_signals=False)  # type: ignore[operator]
    try:
        url_a = notebook.show(tmp_path / "runs" / "a")
        url_b = notebook.show(tmp_path / "runs" / "b")
        assert url_a.endswith("/run/a") and url_b.endswith("/run/b")
        assert url_a.rsplit("/run/", 1)[0] == url_b.rsplit("/run/", 1)[0]  # one server for the folder
        with urllib.request.urlopen(url_a, timeout=30) as resp:  # the closed run replays
            assert resp.status == 200
        with urllib.request.urlopen(url_a.rsplit("/run/", 1)[0] + "/api/runs", timeout=30) as resp:
            listing = resp.read().decode()
        assert '"a"' in listing and '"b"' in listing
    finally:
        notebook.shutdown()
