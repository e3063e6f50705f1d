"""Record what a real browser sends the dashboard's callbacks, as the JSON fixtures under ``payloads/``.

    PYTHONPATH=. .venv/bin/python tests/layouts/record_payloads.py

Real headless Chromium (as tests/browser) drives a real server over the test runs (``rich`` and ``plain``, made by
:mod:`runmaker` as the tests' ``runs_dir`` fixture makes them, plus ``live`` written while it records): the runs
list searched and picked, the run page replayed (play, events, step box, smoothing, zoom, x axis, the events
table), a live run ticking and asked for a snapshot, the compare page's baseline. Each ``/_dash-update-component``
body is kept, a few per callback, in ``payloads/<first output>--<first input>.json``. Run it again when a
callback's inputs change (tests/layouts/test_callback_payloads.py then says so).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "payloads"
#: Payloads kept per callback, and the largest kept (the fixtures stay small).
PER_CALLBACK = 5
MAX_BYTES = 40_000


def fixture_name(payload: dict[str, Any]) -> str:
    first_out = payload["output"].strip(".").split("...")[0].split("@")[0]
    first = payload["inputs"][0] if payload["inputs"] else {"id": "none"}
    if isinstance(first, list):  # a pattern-matching input (ALL): one entry per component
        first = first[0] if first else {"id": {"type": "dict"}}
    first_in = first["id"]
    name = f"{first_out}--{first_in if isinstance(first_in, str) else first_in.get('type', 'dict')}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _wait(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if out := fn():
                return out
        except Exception:  # noqa: BLE001 - the page is still rendering
            pass
        time.sleep(0.1)
    raise SystemExit("record_payloads: the page did not get there in time")


def _drawn(d: Any, graph: str) -> bool:
    return bool(d.execute_script(
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "if (g && g.layout && g.layout.meta === 'gpudash-lazy') { g.scrollIntoView({block: 'center'}); }"
        "return !!(g && g._fullLayout && g.layout.meta !== 'gpudash-lazy');", graph))


def scenario(d: Any, url: str, root: Path) -> None:
    from helpers.runmaker import LiveRun

    d.get(url)
    _wait(lambda: d.find_elements("css selector", "#runs-table-box a"))
    d.find_element("id", "runs-search").send_keys("rich")
    time.sleep(1.5)
    d.find_element("id", "runs-search").clear()
    time.sleep(1.0)
    for box in d.find_elements("css selector", "#runs-table-box input[type=checkbox]")[:2]:
        box.click()
    time.sleep(1.0)

    d.get(url + "run/rich")
    _wait(lambda: _drawn(d, "memory-graph"))
    d.find_element("id", "prev-event").click()
    _wait(lambda: d.find_element("id", "cursor-label").text == "36")
    d.find_element("id", "play-button").click()
    time.sleep(1.6)
    d.find_element("id", "play-button").click()
    d.find_element("id", "cursor-input").send_keys("20\n")
    _wait(lambda: d.find_element("id", "cursor-label").text == "20")
    d.find_element("css selector", "#smoothing").click()
    _wait(lambda: [e for e in d.find_elements("css selector", "[role=option]")
                   if e.is_displayed() and e.text.strip() == "EMA 0.9"])[0].click()
    time.sleep(1.0)
    for _ in range(3):  # the graph binds its relayout handler a moment after the first draw
        d.execute_script("Plotly.relayout(document.querySelector('#loss-graph .js-plotly-plot'), "
                         "{'xaxis.range[0]': 5, 'xaxis.range[1]': 25});")
        time.sleep(1.0)
        if "x0=5" in d.current_url:
            break
    d.execute_script("Plotly.relayout(document.querySelector('#memory-graph .js-plotly-plot'), "
                     "{'xaxis.autorange': true});")
    time.sleep(1.0)
    d.find_element("css selector", "#x-mode input[value=relative]").click()
    time.sleep(1.5)
    d.execute_script("document.getElementById('events-box').scrollIntoView()")
    _wait(lambda: d.find_elements("css selector", "#events-table td[data-dash-column=kind]"))
    d.find_element("css selector", "#events-table td[data-dash-column=kind]").click()
    _wait(lambda: d.find_element("id", "cursor-label").text == "0")
    d.find_element("id", "next-event").click()
    time.sleep(1.0)

    with LiveRun(root / "live", delay=0.05, name="live-run"):
        time.sleep(1.0)
        d.get(url + "run/live")
        _wait(lambda: _drawn(d, "step-time-graph"))
        time.sleep(6.5)  # past the 10th live tick (500 ms each): the one the ranks filter passes on
        d.find_element("id", "snapshot-request").click()
        time.sleep(1.0)
    time.sleep(2.0)

    d.get(url + "compare?runs=rich,plain")
    _wait(lambda: d.find_elements("id", "compare-baseline"))
    d.find_element("css selector", "#compare-baseline").click()
    _wait(lambda: [e for e in d.find_elements("css selector", "[role=option]") if e.is_displayed()])[-1].click()
    time.sleep(1.5)


def _fired(body: dict[str, Any]) -> str:
    """What fired, and how: the inputs that changed with their values' shape (a zoom is not an autosize)."""
    changed = set(body["changedPropIds"])
    shapes = []
    for i in body["inputs"]:
        for item in i if isinstance(i, list) else [i]:
            name = f"{json.dumps(item['id'], sort_keys=True, separators=(',', ':')) if isinstance(item['id'], dict) else item['id']}" \
                   f".{item['property']}"
            if name in changed:
                v = item.get("value")
                shape = sorted(v) if isinstance(v, dict) else re.sub(r"\d+", "N", v) \
                    if isinstance(v, str) and len(v) <= 12 else type(v).__name__
                shapes.append(f"{name}={shape}")
    if shapes and all(x.endswith("=['autosize']") for x in shapes):
        return "autosize"  # every chart sends one when drawn: one such payload per callback is enough
    return "|".join(shapes)


def keep(bodies: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A few payloads per callback, each fired differently (another input, or a zoom after an autosize)."""
    out: dict[str, list[dict[str, Any]]] = {}
    fired: set[tuple[str, str]] = set()
    for body in bodies:
        name, how = fixture_name(body), _fired(body)
        kept = out.setdefault(name, [])
        if len(json.dumps(body)) > MAX_BYTES or (name, how) in fired or len(kept) >= PER_CALLBACK:
            continue
        fired.add((name, how))
        kept.append(body)
    return out


def main() -> None:
    sys.path.insert(0, str(HERE.parent))  # run as a script: tests/ (its helpers), as pytest's pythonpath has it
    from flask import request
    from helpers.browser import make_driver
    from helpers.runmaker import HOSTILE, train

    from gpudash.server.access import serve_wsgi
    from gpudash.server.app import create_app

    root = Path(tempfile.mkdtemp(prefix="gpudash-record-"))
    train(root / "rich", 40, rich=True, name=f"rich {HOSTILE}")
    train(root / "plain", 30)
    app = create_app(root)
    bodies: list[dict[str, Any]] = []

    @app.server.before_request
    def record() -> None:
        if request.path.endswith("/_dash-update-component"):
            body = request.get_json(silent=True)
            if isinstance(body, dict):
                bodies.append(body)

    server, _ = serve_wsgi(app.server, "127.0.0.1", 0, "record-payloads")
    d = make_driver()
    try:
        scenario(d, f"http://127.0.0.1:{server.server_port}/", root)
    finally:
        d.quit()
        server.shutdown()
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("*.json"):
        old.unlink()
    for name, payloads in sorted(keep(bodies).items()):
        write(OUT / f"{name}.json", payloads)
        print(f"{name}: {len(payloads)}")


def write(path: Path, payloads: list[dict[str, Any]]) -> None:
    """A list with one payload a line (the fixtures stay small and diff by payload)."""
    lines = ",\n".join(json.dumps(p, sort_keys=True, separators=(",", ":")) for p in payloads)
    path.write_text(f"[\n{lines}\n]\n")


if __name__ == "__main__":
    main()
