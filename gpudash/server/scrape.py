"""What one Prometheus scrape reads of a runs folder: :class:`RunsCollector`, a custom ``prometheus_client``
collector over the newest rows of each run (HTTP, the exporter's command line and the in-process server are
in :mod:`gpudash.server.metrics`).

It reads through :class:`gpudash.store.RunReader` (any process; never the training loop) and exposes the
values with units in the names and ``run``, ``rank``, ``node`` and ``gpu`` labels. Each series is its newest
value carried forward (a column written every N steps keeps its last value between writes); finished runs
stay unless ``max_age_s`` drops those that ended longer ago; the run-level facts come from
:mod:`gpudash.analysis.facts`, as every other surface shows them; phases are the run's recorded phase set.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from gpudash.analysis.listing import listed_run_row
from gpudash.analysis.phases import run_phases
from gpudash.analysis.ranks import rank_nodes, rank_skew
from gpudash.analysis.rates import RECENT_STEPS, per_second, recent_steps
from gpudash.errors import RunError
from gpudash.server import promnames
from gpudash.server.promnames import LABEL_CHARS, Families, metric_name, prometheus_name
from gpudash.store import mirror as store_mirror
from gpudash.store.bounded import damage
from gpudash.store.listed import listed_run
from gpudash.store.listing import published_metas
from gpudash.store.rankreader import meta_status
from gpudash.store.reader import RankReader, RunReader, is_run_dir
from gpudash.store.runid import list_nested_run_dirs
from gpudash.store.schema import MEMORY_PARTS

__all__ = ["RunsCollector", "metric_name", "metrics_registry", "prometheus_name"]

#: Steps read per scrape to compute rates (tokens/s over the last N steps: the run page's recent window).
WINDOW = RECENT_STEPS
#: New rows read per scrape and table for the carried-forward values (older ones were seen by earlier scrapes).
CARRY_ROWS = 2000
#: Time one run may take in a scrape (its reader busy longer, or its reads slower): the rest of it is skipped.
RUN_BUDGET_S = 20.0  # (gpudash.server.runcache.WAIT_S is the wait for a run another request reads)
#: Problems of one run exposed as ``gpudash_run_damaged{problem=...}`` lines.
MAX_PROBLEMS = 5
_DAMAGED_HELP = "1 for each problem found reading the run (the first few), named in the problem label."
_CATEGORIES = {*MEMORY_PARTS, "optimizer_host_bytes"}
_COUNTERS = {"ooms", "alloc_retries", "cuda_mallocs", "cuda_frees"}
_SCALARS = {"loss": "gpudash_loss", "lr": "gpudash_learning_rate", "learning_rate": "gpudash_learning_rate",
            "grad_norm": "gpudash_grad_norm", "loss_scale": "gpudash_loss_scale",
            "batch_size": "gpudash_batch_size"}
_SKIP = {"step", "time", "rank", "gpu", "samples", "tokens", "duration_s"}
def _latest(df: pd.DataFrame) -> dict[str, Any]:
    """Newest non-null value of each column (some columns are written every N steps)."""
    if df.empty:
        return {}
    last = df.ffill().iloc[-1]
    return {k: v for k, v in last.items() if isinstance(v, (int, float)) and v == v}


class RunsCollector:
    """Collects the latest values of every run under ``runs_dir`` (or of ``runs_dir`` itself)."""

    def __init__(self, runs_dir: str | os.PathLike[str], max_age_s: float | None = None,
                 rescan_s: float = 5.0, facts: bool = True) -> None:
        self.runs_dir = Path(runs_dir)
        self.facts = facts
        self.max_age_s = max_age_s
        self.rescan_s = rescan_s
        #: run id -> run folder; readers are the one run cache's (analysis.runcache.shared_cache)
        self._paths: dict[str, Path] = {}
        #: (run, rank, table, gpu) -> (rowid read up to, newest value of each column)
        self._carry: dict[tuple[str, int, str, int | None], tuple[int, dict[str, Any]]] = {}
        self._scanned = 0.0
        self._lock = threading.Lock()
        self._deadline = float("inf")

    def _discover(self) -> None:
        now = time.monotonic()
        if now - self._scanned < self.rescan_s and self._paths:
            return
        self._scanned = now
        found: dict[str, Path] = {}
        root = self.runs_dir
        if is_run_dir(root):
            found[root.name] = root  # the run this process writes (MetricsServer), named by its owner
        else:  # a runs folder: the dashboard's run ids, nothing that links out of it
            found = dict(list_nested_run_dirs(root))
        self._paths = found

    def collect(self) -> Iterator[Metric]:

        # no lock across the scrape: a run that is slow to read (someone else's damaged folder) holds up
        # only itself, and the next scrape is answered all the same
        with self._lock:
            self._discover()
            paths = sorted(self._paths.items())
        fams = Families()
        now = time.time()
        opened = 0
        for run_id, path in paths:
            try:
                if listed_run(path) is not None:  # listed from an object store: opened only when live
                    row = listed_run_row(run_id, path)
                    if row["status"] != "live" or opened >= store_mirror.OPEN_RUNS:
                        self._collect_listed(fams, run_id, path, row, now, skipped=row["status"] == "live")
                        continue
                    opened += 1
                self._collect_run(fams, run_id, path, now)
            except RunError:
                continue
            except Exception as exc:  # noqa: BLE001 - one damaged run must not break the scrape
                self._damaged(fams, run_id, "all", exc)
        for run_id, label in sorted(fams.bad_text.items()):
            fams.add("gpudash_run_damaged", _DAMAGED_HELP,
                     {"run": run_id, "problem": f"a recorded {label} is not valid UTF-8 text; shown escaped"}, 1,
                     capped=False)
        for run_id, n in sorted(fams.dropped.items()):
            fams.add("gpudash_series_dropped", f"Series of the run beyond the {promnames.MAX_SERIES_PER_RUN} served per run.",
                     {"run": run_id}, n, capped=False)
        yield from fams.families.values()

    def _collect_listed(self, fams: Families, run_id: str, path: Path, row: dict[str, Any], now: float,
                        skipped: bool) -> None:
        """A run of an object store not opened for the scrape (finished or crashed, or live beyond the
        :data:`gpudash.store.mirror.OPEN_RUNS` opened at once): what its listing says, its segments unread.
        Each rank's liveness and heartbeat, and the run's steps (as its facts count them); its other values
        wait for the run to be opened (its page, or while it is live)."""
        rank_meta = published_metas(path, [])
        beats = [float(m.get("heartbeat") or 0) for m in rank_meta.values()]
        if row["status"] != "live" and self.max_age_s is not None and now - max(beats, default=0.0) > self.max_age_s:
            return
        for rank, meta in sorted(rank_meta.items()):
            lab = {"run": run_id, "rank": str(rank), "node": rank_nodes({rank: meta})[rank]}
            fams.add("gpudash_run_live", "1 while the run's writer is alive, 0 once finished or crashed.", lab,
                     row["status"] == "live" and meta_status(meta) == "live")
            fams.add("gpudash_heartbeat_timestamp_seconds", "Last time the run's writer flushed (unix time).", lab,
                     float(meta.get("heartbeat") or 0) or float("nan"))
        for problem in row["problems"][:MAX_PROBLEMS]:
            fams.add("gpudash_run_damaged", _DAMAGED_HELP, {"run": run_id, "problem": problem}, 1, capped=False)
        if skipped:
            fams.add("gpudash_scrape_errors", "Ranks that could not be read in this scrape.",
                     {"run": run_id, "rank": "all", "error": "OverOpenRunsLimit"}, 1, capped=False)
        if self.facts:
            fams.add("gpudash_steps", "Steps recorded (last step index + 1).", {"run": run_id}, row["steps"])

    @staticmethod
    def _damaged(fams: Families, run_id: str, rank: str, exc: BaseException) -> None:
        fams.add("gpudash_scrape_errors", "Ranks that could not be read in this scrape.",
                 {"run": run_id, "rank": rank, "error": type(exc).__name__}, 1, capped=False)
        fams.add("gpudash_run_damaged", _DAMAGED_HELP, {"run": run_id, "problem": damage(exc)}, 1, capped=False)

    def _collect_run(self, fams: Families, run_id: str, path: Path, now: float) -> None:
        from gpudash.server.runcache import shared_cache

        reader, reader_lock = shared_cache().reader(path)
        if not reader_lock.acquire(timeout=RUN_BUDGET_S):
            self._damaged(fams, run_id, "all", TimeoutError(f"still being read after {RUN_BUDGET_S:g} s; skipped"))
            return
        tails: list[tuple[pd.DataFrame, pd.DataFrame]] = []
        try:
            self._deadline = time.monotonic() + RUN_BUDGET_S
            reader.refresh()
            for rank, rr in sorted(reader.ranks.items()):
                if time.monotonic() > self._deadline:
                    self._damaged(fams, run_id, str(rank),
                                  TimeoutError(f"reading took over {RUN_BUDGET_S:g} s; the rest skipped"))
                    break
                try:
                    tail = self._collect_rank(fams, run_id, rank, rr, now)
                except Exception as exc:  # noqa: BLE001 - one damaged rank must not break the scrape
                    self._damaged(fams, run_id, str(rank), exc)
                    continue
                if tail is not None:
                    tails.append(tail)
            problems = reader.all_problems()
        finally:
            reader_lock.release()
        for problem in problems[:MAX_PROBLEMS]:  # one line each, naming the damage
            fams.add("gpudash_run_damaged", _DAMAGED_HELP, {"run": run_id, "problem": problem}, 1, capped=False)
        if len(tails) > 1:
            self._skew(fams, run_id, tails)
        if tails and self.facts:
            self._facts(fams, run_id, reader)

    @staticmethod
    def _facts(fams: Families, run_id: str, reader: RunReader) -> None:
        """Run-level gauges from the run's facts (the numbers the report and the API state)."""
        from gpudash.server.runcache import shared_cache

        try:
            facts = shared_cache().get(reader.path, timeout=RUN_BUDGET_S).facts
        except Exception as exc:  # noqa: BLE001 - a damaged run must not break the scrape
            fams.add("gpudash_scrape_errors", "Ranks that could not be read in this scrape.",
                     {"run": run_id, "rank": "all", "error": type(exc).__name__}, 1)
            return
        lab = {"run": run_id}
        fams.add("gpudash_steps", "Steps recorded (last step index + 1).", lab, facts.steps)
        fams.add("gpudash_ooms", "Out-of-memory errors, each counted once.", lab, facts.oom_count, counter=True)
        fams.add("gpudash_loss_spikes", "Steps whose loss was a spike (gpudash's one spike rule).", lab,
                 len(facts.loss_spike_steps), counter=True)
        fams.add("gpudash_nonfinite_steps", "Steps with a NaN/Inf loss or gradients.", lab,
                 len(facts.nonfinite_steps), counter=True)
        if facts.peak_bytes.get("measured") is not None:
            fams.add("gpudash_measured_peak_bytes", "Largest measured per-step memory peak of the run.", lab,
                     facts.peak_bytes["measured"])
        head = facts.headline
        for key, name, what in (("tokens_per_s", "gpudash_run_tokens_per_second", "Tokens"),
                                ("samples_per_s", "gpudash_run_samples_per_second", "Samples")):
            if head.get(key) is not None:
                fams.add(name, f"{what} per second over the whole run, all ranks (as gpudash info states it).", lab,
                         head[key])
        if head.get("mfu") is not None:
            fams.add("gpudash_run_mfu_ratio", "Model FLOPs utilisation over the whole run.", lab, head["mfu"])
        if facts.recent.mfu is not None:
            fams.add("gpudash_mfu_ratio", f"Model FLOPs utilisation over the last {RECENT_STEPS} steps, all ranks.",
                     lab, facts.recent.mfu)
        if facts.fragmentation_pct is not None:
            fams.add("gpudash_fragmentation_ratio", "Worst share of reserved memory in inactive split blocks.",
                     lab, facts.fragmentation_pct / 100.0)
        energy = facts.energy
        if energy is not None:
            fams.add("gpudash_run_energy_joules", "Energy the run's GPUs and CPU packages drew (as gpudash info "
                     "states it).", lab, energy.total_j, counter=True)
            for value, name, what in ((energy.j_per_step, "gpudash_run_energy_per_step_joules", "Joules per step"),
                                      (energy.wh_per_mtok, "gpudash_run_energy_per_mtok_wh",
                                       "Watt-hours per million tokens")):
                if value is not None:
                    fams.add(name, f"{what} while the steps ran, all ranks.", lab, value)
            for who, joules in energy.per_gpu_j.items():  # "rank R GPU G": the run's energy by GPU
                _, rank, _, gpu = who.split()
                fams.add("gpudash_run_gpu_energy_joules", "Energy each GPU drew over the run (gpudash info's per "
                         "GPU).", {**lab, "rank": rank, "gpu": gpu}, joules, counter=True)
            for who, joules in energy.per_rank_j.items():  # "rank R": its GPUs and its machine's CPU packages
                fams.add("gpudash_run_rank_energy_joules", "Energy each rank's GPUs (and its machine's CPU packages, "
                         "counted once) drew over the run.", {**lab, "rank": who.split()[1]}, joules, counter=True)
        host = facts.host_memory
        if host is not None and host.peak_total_pss_bytes is not None:
            fams.add("gpudash_host_memory_peak_pss_bytes", "Peak host memory (PSS) of the training process and its "
                     "workers together.", lab, host.peak_total_pss_bytes)

    def _carried(self, key: tuple[str, int, str, int | None], rr: RankReader, table: str) -> dict[str, Any]:
        """Newest non-null value of every column of ``table`` (of one GPU when ``key[3]`` is set),
        carried forward from earlier scrapes: a column written every N steps never vanishes."""
        scanned, values = self._carry.get(key, (0, {}))
        top = rr.max_rowid(table)
        if top <= scanned:
            return values
        gpu = key[3]
        match = {"gpu": gpu} if gpu is not None else {}
        new = rr.read_matching(table, match, after_rowid=max(scanned, top - CARRY_ROWS))
        values = {**values, **_latest(new.drop(columns=["_rowid"], errors="ignore"))}
        if not scanned:  # the first look at this run: columns not written lately, one indexed lookup each
            for col in rr.columns(table):
                if col in values or col in ("_rowid", "rank", "gpu"):
                    continue
                if time.monotonic() > self._deadline:
                    break  # a table of thousands of never-written columns: the rest on the next scrape
                value = rr.newest_value(table, col, match)
                if isinstance(value, (int, float)):
                    values[col] = value
        self._carry[key] = (top, values)
        return values

    @staticmethod
    def _skew(fams: Families, run_id: str, tails: list[tuple[pd.DataFrame, pd.DataFrame]]) -> None:
        """Straggler gauges from the newest step every rank recorded."""
        def joined(frames: list[pd.DataFrame]) -> pd.DataFrame:  # ranks without memory rows (a CPU run): none
            frames = [f for f in frames if not f.empty]
            return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

        steps = joined([t[0] for t in tails])
        memory = joined([t[1] for t in tails])
        skew = rank_skew(SimpleNamespace(steps=steps, memory=memory))
        if skew.empty:
            return
        last = skew.iloc[-1]
        lab = {"run": run_id}
        fams.add("gpudash_step_skew_seconds", "Slowest minus fastest rank's time for the newest common step.",
                 lab, last["skew_s"])
        fams.add("gpudash_step_skew_ratio", "Slowest rank's step time over the median rank's, minus 1.", lab,
                 last["skew_ratio"])
        if "memory_imbalance" in skew:
            fams.add("gpudash_memory_imbalance_ratio", "Heaviest rank's memory over the mean rank's, minus 1.",
                     lab, last["memory_imbalance"])

    def _collect_rank(self, fams: Families, run_id: str, rank: int, rr: RankReader,
                      now: float) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """Add one rank's metrics; returns its newest (steps, memory) rows for the straggler gauges."""
        meta = rr.meta()
        status = rr.status(meta, now)
        heartbeat = float(meta.get("heartbeat") or 0)
        if status != "live" and self.max_age_s is not None and now - heartbeat > self.max_age_s:
            return None
        # the machine the rank ran on (host name or $GPUDASH_HOSTNAME): a fleet's nodes side by side
        lab = {"run": run_id, "rank": str(rank), "node": rank_nodes({rank: meta})[rank]}
        fams.add("gpudash_run_live", "1 while the run's writer is alive, 0 once finished or crashed.", lab,
                 status == "live")
        fams.add("gpudash_heartbeat_timestamp_seconds", "Last time the run's writer flushed (unix time).", lab,
                 heartbeat or float("nan"))
        key = (run_id, rank)
        steps = self._steps(fams, lab, rr, key, meta)
        memory = self._memory(fams, lab, rr, key)
        self._simple(fams, lab, rr, "host", "gpudash_host_", key)
        self._device(fams, lab, rr, key)
        self._events(fams, lab, rr)
        return steps.assign(rank=rank), memory.assign(rank=rank)

    @staticmethod
    def _tail(rr: RankReader, table: str, rows: int) -> pd.DataFrame:
        return rr.read(table, after_rowid=max(0, rr.max_rowid(table) - rows))

    def _steps(self, fams: Families, lab: dict[str, str], rr: RankReader, key: tuple[str, int],
               meta: dict[str, Any]) -> pd.DataFrame:
        df = self._tail(rr, "steps", WINDOW)
        if df.empty:
            return df
        last = self._carried((*key, "steps", None), rr, "steps")
        fams.add("gpudash_step", "Index of the newest recorded training step.", lab, last.get("step"))
        fams.add("gpudash_last_step_timestamp_seconds", "When the newest step ended (unix time).", lab,
                 last.get("time"))
        fams.add("gpudash_step_duration_seconds", "Wall time of the newest step.", lab,
                 df["duration_s"].iloc[-1])
        phases = {f"{p}_s" for p in run_phases(meta, last)}
        for col in sorted(last):
            if col in _SKIP or col == "_rowid":
                continue
            if col in phases:
                fams.add("gpudash_phase_duration_seconds", "Time spent in each phase of the newest step.",
                         {**lab, "phase": col[:-2]}, df[col].iloc[-1] if col in df and pd.notna(df[col].iloc[-1])
                         else 0.0)
            elif col in _SCALARS:
                fams.add(_SCALARS[col], f"Newest logged {col}.", lab, last[col])
            else:
                fams.add("gpudash_logged_value", "Newest value of other scalars logged with Monitor.log.",
                         {**lab, "name": col}, last[col])
        recent = recent_steps(df, WINDOW)
        for col, name in (("samples", "gpudash_samples_per_second"), ("tokens", "gpudash_tokens_per_second")):
            if col in recent and "time" in recent:
                rate = per_second(recent[col], recent["time"], recent.get("duration_s"))
                if rate is not None:
                    fams.add(name, f"{col.capitalize()} per second of the rank over its last {WINDOW} steps.", lab,
                             rate)
        return df

    def _memory(self, fams: Families, lab: dict[str, str], rr: RankReader, key: tuple[str, int]) -> pd.DataFrame:
        df = self._tail(rr, "memory", WINDOW)
        last = self._carried((*key, "memory", None), rr, "memory")
        for col, value in last.items():
            if col in _SKIP or col == "_rowid":
                continue
            if col in _CATEGORIES:
                fams.add("gpudash_memory_category_bytes",
                         "Memory by category (params, grads, optimizer, activations, other).",
                         {**lab, "category": col.removesuffix("_bytes")}, value)
            elif col in _COUNTERS:
                fams.add(f"gpudash_memory_{col}", f"torch allocator counter {col}.", lab, value, counter=True)
            else:
                name, factor = prometheus_name(col)
                fams.add(f"gpudash_memory_{name}", f"Newest {col} from the memory record.", lab, value * factor)
        return df

    def _simple(self, fams: Families, lab: dict[str, str], rr: RankReader, table: str, prefix: str,
                key: tuple[str, int]) -> None:
        for col, value in self._carried((*key, table, None), rr, table).items():
            if col in _SKIP or col == "_rowid":
                continue
            name, factor = prometheus_name(col)
            fams.add(prefix + name, f"Newest {table} sample of {col}.", lab, value * factor)

    def _device(self, fams: Families, lab: dict[str, str], rr: RankReader, key: tuple[str, int]) -> None:
        if "gpu" not in rr.columns("device"):
            return
        gpus = [int(g) for g in rr.distinct("device", "gpu", 1025) if isinstance(g, int) and 0 <= g < 1 << 16][:1024]
        for gpu in gpus:
            glab = {**lab, "gpu": str(gpu)}
            for col, value in self._carried((*key, "device", gpu), rr, "device").items():
                if col in _SKIP or col == "_rowid":
                    continue
                name, factor = prometheus_name(col)
                fams.add(f"gpudash_device_{name}", f"Newest NVML sample of {col}.", glab, value * factor)

    def _events(self, fams: Families, lab: dict[str, str], rr: RankReader) -> None:
        for kind, count in rr.count_by("events", "kind", LABEL_CHARS, 1000):
            fams.add("gpudash_events", "Events recorded by kind (oom, batch_size_change, ...).",
                     {**lab, "kind": str(kind)}, count, counter=True)


def metrics_registry(runs_dir: str | os.PathLike[str], **collector_kwargs: Any) -> CollectorRegistry:
    """A registry holding only the gpudash collector for ``runs_dir``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(runs_dir, **collector_kwargs))
    return registry
