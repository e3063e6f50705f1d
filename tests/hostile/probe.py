"""Every surface over one runs folder, in a process held to 2 GiB: ``python probe.py RUNS_DIR BAD GOOD``.

Prints one JSON object: per surface, the text it answered (cut to 4 kB, with its full size), whether
it raised, and the seconds it took; the test in ``test_hostile_runs.py`` reads it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

LIMIT = int(os.environ.get("PROBE_MEMORY_BYTES", str(2 << 30)))


def _answer(fn: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            text = fn()
        raised = None
    except BaseException as exc:  # noqa: BLE001 - what a surface raises is the finding
        text, raised = "", f"{type(exc).__name__}: {str(exc)[:300]}"
    text = f"{text or ''}{out.getvalue()}{err.getvalue()}"
    # whole up to 20,000 characters (a listing must parse), else its head and tail
    return {"text": text if len(text) <= 20_000 else text[:4000] + text[-2000:], "size": len(text),
            "raised": raised, "s": round(time.monotonic() - t0, 2)}


def _peak_rss() -> int:
    """This process's peak resident memory (VmHWM: its own, where ru_maxrss keeps the parent's across exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    runs_dir, bad, good = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
    from prometheus_client import generate_latest

    from gpudash.cli import main as cli
    from gpudash.server.app import create_app
    from gpudash.server.layouts.callbacks import ReaderCache, page_for
    from gpudash.server.metrics import metrics_registry
    from gpudash.store import load_run

    def loaded(run_id: str) -> str:
        r = load_run(runs_dir / run_id)
        try:
            return json.dumps({"problems": r.problems, "steps": len(r.steps), "events": len(r.events),
                               "name": r.name[:100]})
        finally:
            r.close()

    def page(run_id: str) -> str:
        """The run page's damage notes (``run-problems``, or ``run-damaged`` for a page that cannot be
        drawn) first, then the whole page as JSON (its size is what the browser would get)."""
        import plotly

        tree = json.loads(json.dumps(page_for(f"/run/{run_id}", "", runs_dir, ReaderCache(runs_dir)),
                                     cls=plotly.utils.PlotlyJSONEncoder))
        notes: list[str] = []

        def walk(node: Any, inside: bool) -> None:
            if isinstance(node, str) and inside:
                notes.append(node)
            elif isinstance(node, list):
                for n in node:
                    walk(n, inside)
            elif isinstance(node, dict):
                props = node.get("props", {})
                walk(props.get("children"), inside or props.get("id") in ("run-problems", "run-damaged"))
                if props.get("id") in ("run-problems", "run-damaged"):
                    notes.append(f"[{props['id']}]")

        walk(tree, False)
        return " | ".join(notes) + " || " + json.dumps(tree)

    client = create_app(runs_dir).server.test_client()

    def get(url: str) -> str:
        resp = client.get(url)
        return f"{resp.status_code} {resp.get_data(as_text=True)}"

    result = {
        "load_run": _answer(lambda: loaded(bad)),
        "load_run_good": _answer(lambda: loaded(good)),
        "info": _answer(lambda: str(cli(["info", str(runs_dir / bad)]))),
        "report": _answer(lambda: str(cli(["report", str(runs_dir / bad), "--format", "md"]))),
        "page": _answer(lambda: page(bad)),
        "page_good": _answer(lambda: page(good)),
        "api_runs": _answer(lambda: get("/api/runs")),
        "api_summary": _answer(lambda: get(f"/api/runs/{bad}/summary")),
        "api_summary_good": _answer(lambda: get(f"/api/runs/{good}/summary")),
        "metrics": _answer(lambda: generate_latest(metrics_registry(runs_dir)).decode()),
        "peak_rss_bytes": _peak_rss(),
    }
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
