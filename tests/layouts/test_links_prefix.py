"""Behind a proxy prefix (Jupyter's /user/NAME/proxy/PORT/) every in-page link stays under it: the hrefs the
router and the runs-list callbacks send name the prefix; an app served at / sends plain paths."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.dashpost import post

PREFIX = "/user/alice/proxy/8050/"


def _hrefs(resp: Any) -> list[str]:
    assert resp.status_code == 200, resp.data[:300]
    return re.findall(r'"href": "([^"]*)"', json.dumps(resp.get_json()))


@pytest.mark.parametrize("prefix", [PREFIX, "/"])
def test_links_stay_under_the_prefix(runs_dir: Path, prefix: str) -> None:
    from gpudash.server.app import create_app

    app = create_app(runs_dir, requests_pathname_prefix=prefix)
    client = app.server.test_client()
    under = prefix.rstrip("/")
    pages = {"": [f"{under}/run/rich", f"{under}/compare"], "run/rich": [f"{under}/", f"{under}/run/rich?rank=0"],
             "compare?runs=rich,plain": [f"{under}/"], "run/nope": [f"{under}/"], "nowhere": [f"{under}/"]}
    for page, want in pages.items():
        path, _, search = page.partition("?")
        hrefs = _hrefs(post(client, app, "page.children", {"url.pathname": prefix + path,
                                                           "url.search": "?" + search if search else ""}))
        assert set(want) <= set(hrefs), (page, hrefs)
        assert all(h.startswith(f"{under}/") or h.startswith("#") for h in hrefs), (page, hrefs)
    table = _hrefs(post(client, app, "runs-table-box.children", {"runs-interval.n_intervals": 1, "runs-search.value": "",
                                                                 "runs-status.value": "all", "runs-page-no.data": 0},
                        {"runs-shown.data": None}))
    assert f"{under}/run/plain" in table and f"{under}/run/rich" in table
    pick = {"id": {"type": "compare-pick", "run": "rich"}, "property": "value", "value": ["rich"]}
    compare = client.post("/_dash-update-component", json={
        "output": "compare-link.href", "outputs": {"id": "compare-link", "property": "href"}, "inputs": [[pick]],
        "state": [], "changedPropIds": ['{"run":"rich","type":"compare-pick"}.value']})
    assert _hrefs(compare) == [f"{under}/compare?runs=rich"]
