"""Prometheus names for run columns, and the families of one scrape (for :mod:`gpudash.server.metrics`).

A run's columns become metric names with units in them (``power_w`` -> ``power_watts``); any other
character becomes an underscore, as the exposition would escape it, so two columns that clean to one
name share one family (one HELP and TYPE line) and one sample per label set, and a run exposes at most
:data:`MAX_SERIES_PER_RUN` series (someone else's run folder may hold thousands of columns).
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["LABEL_CHARS", "MAX_SERIES_PER_RUN", "Families", "metric_name", "prometheus_name"]

#: Series one run may expose per scrape; the rest are dropped and counted (``gpudash_series_dropped``).
MAX_SERIES_PER_RUN = 2000
#: Characters kept of a label value taken from a run (a run id, a column name, an event kind, a problem).
LABEL_CHARS = 200
_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
#: Column unit suffix -> (Prometheus base-unit suffix, factor); the first match wins.
_UNITS: tuple[tuple[str, str, float], ...] = (
    ("_mib_s", "_bytes_per_second", 1024.0 * 1024.0),
    ("_bytes_s", "_bytes_per_second", 1.0),
    ("_pct", "_ratio", 0.01),
    ("_mhz", "_hertz", 1e6),
    ("_w", "_watts", 1.0),
    ("_c", "_celsius", 1.0),
    ("_j", "_joules", 1.0),
    ("_bytes", "_bytes", 1.0),
    ("_s", "_seconds", 1.0),
)


def prometheus_name(column: str) -> tuple[str, float]:
    """A run column in Prometheus base units: ``power_w`` -> (``power_watts``, 1),
    ``util_pct`` -> (``util_ratio``, 0.01), ``pcie_tx_mib_s`` -> (``pcie_tx_bytes_per_second``, 2**20)."""
    for suffix, unit, factor in _UNITS:
        if column.endswith(suffix):
            return column[: -len(suffix)] + unit, factor
    return column, 1.0


def metric_name(name: str) -> str:
    """``name`` as a legal Prometheus metric name: every other character an underscore (``a"b`` -> ``a_b``),
    as the exposition would escape it; so names that clean to the same one share one family."""
    name = _BAD_NAME_CHARS.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


class Families:
    """Metric families built during one scrape, each with a fixed label set: one family per cleaned name
    (one HELP and TYPE), one sample per label set (the first wins: ``lr`` and ``learning_rate`` are one
    series), at most :data:`MAX_SERIES_PER_RUN` series per run."""

    def __init__(self) -> None:
        self.families: dict[str, Any] = {}
        self._labels: dict[str, list[str]] = {}
        self._seen: set[tuple[str, tuple[str, ...]]] = set()
        self._exposed: dict[str, str] = {}  # name as exposed (a counter's with _total) -> family
        self.series: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        #: run -> the first label whose recorded text was not valid UTF-8 (a lone surrogate): the exposition
        #: would fail to encode it and answer 500 for every run, so it is escaped and the run named damaged
        self.bad_text: dict[str, str] = {}

    def _text(self, val: str, run: str, label: str) -> str:
        try:
            val.encode("utf-8")
            return val
        except UnicodeEncodeError:
            self.bad_text.setdefault(run.encode("utf-8", "backslashreplace").decode(), label)
            return val.encode("utf-8", "backslashreplace").decode("utf-8")

    def add(self, name: str, doc: str, labels: dict[str, str], value: Any, counter: bool = False,
            capped: bool = True) -> None:
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            return
        if v != v:  # NaN: nothing recorded
            return
        name = metric_name(name)
        labels = {k: self._text(str(val)[:LABEL_CHARS], labels.get("run", ""), k) for k, val in labels.items()}
        run = labels.get("run", "") if capped else ""
        key = (name, tuple(labels.values()))
        if key in self._seen:
            return  # the same series from another column (``lr`` and ``learning_rate``)
        fam = self.families.get(name)
        if fam is None:
            exposed = name + "_total" if counter else name
            if self._exposed.get(exposed, name) != name or (counter and name in self._exposed):
                return  # a gauge and a counter that would expose one name
            if self.series.get(run, 0) >= MAX_SERIES_PER_RUN and run:
                self.dropped[run] = self.dropped.get(run, 0) + 1
                return
            cls = CounterMetricFamily if counter else GaugeMetricFamily
            fam = cls(name, doc, labels=list(labels))
            self.families[name] = fam
            self._labels[name] = list(labels)
            self._exposed[exposed] = name
        elif list(labels) != self._labels[name] or isinstance(fam, CounterMetricFamily) != counter:
            return
        elif self.series.get(run, 0) >= MAX_SERIES_PER_RUN and run:
            self.dropped[run] = self.dropped.get(run, 0) + 1
            return
        self._seen.add(key)
        if run:
            self.series[run] = self.series.get(run, 0) + 1
        fam.add_metric(list(labels.values()), v)
