"""gpudash's pages load plotly.js's cartesian partial bundle (gpudash/server/layouts/vendor): the same plotly.js
version as Dash's full bundle, every trace type gpudash draws included, served in place of the full one for
gpudash's app only."""

from __future__ import annotations

import re
from pathlib import Path

import plotly

from gpudash.server.layouts.style import PLOTLY_BUNDLE

PKG = Path(__file__).resolve().parents[2] / "gpudash"
VENDOR = PKG / PLOTLY_BUNDLE.split("/", 1)[1]
#: The trace modules of the cartesian bundle (its README) and plotly's other trace types.
CARTESIAN = {"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie",
             "scatter", "scatterternary", "violin"}
OTHERS = {"scattergl", "scatter3d", "surface", "mesh3d", "cone", "streamtube", "volume", "isosurface", "scattergeo",
          "choropleth", "scattermapbox", "scattermap", "choroplethmap", "densitymap", "parcoords", "parcats",
          "sankey", "treemap", "sunburst", "icicle", "funnel", "funnelarea", "waterfall", "candlestick", "ohlc",
          "indicator", "table", "splom", "scatterpolar", "scatterpolargl", "barpolar", "scattercarpet",
          "contourcarpet", "carpet", "heatmapgl", "pointcloud", "scattersmith", "densitymapbox",
          "choroplethmapbox"}


def _version(path: Path) -> str:
    head = path.read_text(encoding="utf-8", errors="replace")[:400]
    m = re.search(r"plotly\.js(?: \([^)]*\))? v(\d+\.\d+\.\d+)", head)
    assert m, head
    return m.group(1)


def test_the_bundle_is_the_plotly_js_version_dash_ships() -> None:
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert "(cartesian" in VENDOR.read_text(encoding="utf-8", errors="replace")[:200]
    assert _version(VENDOR) == _version(full)
    assert (VENDOR.parent / "LICENSE-plotly.js").read_text().startswith("MIT License")


def test_every_trace_type_gpudash_draws_is_in_the_bundle() -> None:
    used: set[str] = set()
    for py in (PKG / "server" / "layouts").rglob("*.py"):  # every figure is built there
        used |= set(re.findall(r"""["']type["']\s*:\s*["'](\w+)["']""", py.read_text()))
        used |= set(re.findall(r"""\btype\s*=\s*["'](\w+)["']""", py.read_text()))
    traces = used & (CARTESIAN | OTHERS)
    assert {"scatter", "bar", "heatmap"} <= traces  # the scan finds what the views draw
    assert traces <= CARTESIAN, f"not in the cartesian bundle: {sorted(traces - CARTESIAN)}"


def test_the_app_serves_the_bundle_instead_of_the_full_plotly_js(tmp_path: Path) -> None:
    import dash

    from gpudash.server.app import create_app

    app = create_app(tmp_path)
    client = app.server.test_client()
    page = client.get("/run/x").get_data(as_text=True)
    assert PLOTLY_BUNDLE in page and "package_data/plotly.min.js" not in page
    resp = client.get("/_dash-component-suites/" + PLOTLY_BUNDLE)
    assert resp.status_code == 200 and resp.get_data() == VENDOR.read_bytes()
    # another Dash app in the same process keeps the full plotly.js
    other = dash.Dash(__name__)
    other.layout = dash.html.Div()
    assert "plotly-cartesian" not in other.index()


def test_preloaded_chunks_are_the_ones_dash_serves(tmp_path: Path) -> None:
    """The run page preloads Dash's graph, dropdown and slider chunks by path: each must exist in the installed
    Dash (a renamed chunk would be a 404 in every page's console) and be what the page links."""
    import dash

    from gpudash.server.app import create_app
    from gpudash.server.layouts.style import FIRST_SCREEN_CHUNKS

    installed = Path(dash.__file__).parent
    client = create_app(tmp_path).server.test_client()
    page = client.get("/").get_data(as_text=True)
    for chunk in FIRST_SCREEN_CHUNKS:
        assert (installed / chunk.split("/", 1)[1]).is_file(), chunk
        assert f"href='/_dash-component-suites/{chunk}'" in page, chunk
        assert client.get(f"/_dash-component-suites/{chunk}").status_code == 200, chunk
