"""The runs page's pager through the Dash callbacks, as the browser posts them: newer / older pages, a
search or status filter starting again at the newest runs, crafted page numbers refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.dashpost import post

from gpudash.server.app import create_app
from gpudash.server.layouts import runs

REFRESH = "runs-table-box.children"


@pytest.fixture
def app(runs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(runs, "PER_PAGE", 1)  # the two runs of the fixture: two pages
    return create_app(runs_dir)


def _refresh(app: Any, page: Any, query: str = "", status: str = "all", trigger: str = "runs-page-no.data") -> Any:
    return post(app.server.test_client(), app, REFRESH,
                {"runs-interval.n_intervals": 1, "runs-search.value": query, "runs-status.value": status,
                 "runs-page-no.data": page},
                {'{"run":["ALL"],"type":"compare-pick"}.value': [], "runs-shown.data": None}, trigger)


def _links(resp: Any) -> list[str]:
    return [h for h in ("/run/rich", "/run/plain") if h in json.dumps(resp.json["response"]["runs-table-box"])]


def test_pages_show_the_newest_runs_first(app: Any) -> None:
    first, second = _refresh(app, 0), _refresh(app, 1)
    assert first.status_code == second.status_code == 200
    assert _links(first) == ["/run/plain"] and _links(second) == ["/run/rich"]  # plain is the newer run
    assert first.json["response"]["runs-page-label"]["children"] == "1–1 of 2 · page 1 of 2"
    assert first.json["response"]["runs-prev"]["disabled"] and not first.json["response"]["runs-next"]["disabled"]
    assert second.json["response"]["runs-next"]["disabled"] and not second.json["response"]["runs-prev"]["disabled"]
    assert _links(_refresh(app, 7)) == ["/run/rich"]  # past the end: the last page
    found = _refresh(app, 1, query="RICH", trigger="runs-search.value")
    assert _links(found) == ["/run/rich"] and "1 match" in found.json["response"]["runs-count"]["children"]


def test_pager_buttons_and_filters_move_the_page(app: Any) -> None:
    def page_no(trigger: str, page: int, pages: int = 2) -> Any:
        r = post(app.server.test_client(), app, "runs-page-no.data",
                 {"runs-prev.n_clicks": 1, "runs-next.n_clicks": 1, "runs-search.value": "", "runs-status.value": "all"},
                 {"runs-page-no.data": page, "runs-shown.data": [page, pages, 2, 2, []]}, trigger)
        return r.json["response"]["runs-page-no"]["data"] if r.status_code == 200 else r.status_code

    assert page_no("runs-next.n_clicks", 0) == 1
    assert page_no("runs-next.n_clicks", 1) == 1  # already the last page
    assert page_no("runs-prev.n_clicks", 1) == 0 and page_no("runs-prev.n_clicks", 0) == 0
    assert page_no("runs-search.value", 1) == 0 and page_no("runs-status.value", 1) == 0
    assert page_no("runs-next.n_clicks", -3) == 400


@pytest.mark.parametrize("page", [-1, "x", 1e308, [1], 10**9])
def test_crafted_page_numbers_are_bad_requests(app: Any, page: Any) -> None:
    r = _refresh(app, page)
    assert r.status_code == 400 and r.get_data(as_text=True).startswith("gpudash: bad request:")
