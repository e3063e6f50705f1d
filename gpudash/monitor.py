"""The Monitor: the one object that sits in the user's training loop.

    monitor = gpudash.Monitor("runs/exp1")
    monitor.watch(model, optimizer)
    for batch in loader:
        with monitor.step(samples=len(batch)):
            with monitor.phase("forward"):
                loss = model(batch)
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step(); opt.zero_grad()
            monitor.log(loss=loss)
    monitor.close()

The training thread only takes timestamps and appends rows to a bounded
buffer; tensors passed to ``log`` are detached here and turned into numbers by
the writer thread, so nothing on this path waits on the GPU or the disk.
"""

from __future__ import annotations

import atexit
import numbers
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpudash._version import __version__
from gpudash.collectors import default_collectors
from gpudash.collectors.categories import CategoryCollector
from gpudash.collectors.env import cuda_device_meta, describe_environment
from gpudash.errors import RunError
from gpudash.options import MonitorOptions
from gpudash.store.schema import TABLE_BASE_COLUMNS, column_name, is_reserved_column, namespaced_column
from gpudash.store.writer import OPEN_ERRORS, Recorder, write_run_meta

if TYPE_CHECKING:
    from gpudash.collectors.api import Collector, PhaseEndHook, StepEndHook, StepStartHook, StepTimer

__all__ = ["Monitor"]

_CATEGORIES = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
#: Names the Monitor itself writes into a table's rows: a user's value under one is renamed.
_OWN_COLUMNS = {t: frozenset(c for c, _ in TABLE_BASE_COLUMNS[t]) for t in ("steps", "memory")}
_MAX_NAMES = 10_000  # names remembered per table (log() of ever-new names must not grow memory)
#: Values ``log()`` stores as they are (no ``detach``): checked for all of a call's values at once, in C.
_PLAIN = frozenset({float, int, bool, str, type(None)})
_perf = time.perf_counter
_time = time.time


def _rank_from_env() -> tuple[int, int]:
    def env_int(*names: str) -> int | None:
        for n in names:
            v = os.environ.get(n)
            if v is not None and v.strip().lstrip("-").isdigit():
                return int(v)
        return None

    rank = env_int("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID") or 0
    world = env_int("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS") or 1
    return rank, world


def _check_total(total: Any) -> None:
    if total is not None and (isinstance(total, bool) or not isinstance(total, numbers.Integral) or total < 1):
        raise ValueError(f"total_steps={total!r}: pass the number of steps the run will take (a whole number >= 1)")


class _Phase:
    __slots__ = ("_m", "name", "key", "_t0", "_prev")

    def __init__(self, monitor: Monitor, name: str) -> None:
        self._m = monitor
        self.name = name
        self.key = column_name(f"{name}_s")
        self._t0 = 0.0
        self._prev: str | None = None

    def __enter__(self) -> _Phase:
        m = self._m
        self._prev = m.current_phase
        m.current_phase = self.name
        timer = m.cuda_timer
        if timer is not None:
            timer.phase_start(self.name)
        self._t0 = _perf()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        dt = _perf() - self._t0
        m = self._m
        timer = m.cuda_timer
        if timer is not None:
            timer.phase_end(self.name)
        for hook in m._phase_end_hooks:
            try:
                hook(self.name)
            except Exception as exc:  # noqa: BLE001
                m.collector_failed(hook, exc)
        row = m._row
        if row is not None:
            key = self.key
            row[key] = row.get(key, 0.0) + dt
        m.current_phase = self._prev


class _Step:
    __slots__ = ("_m", "samples", "tokens", "_t0")

    def __init__(self, monitor: Monitor) -> None:
        self._m = monitor
        self.samples: Any = None
        self.tokens: Any = None
        self._t0 = 0.0

    def __enter__(self) -> _Step:
        m = self._m
        row: dict[str, Any] = {}
        if m._pending:
            row.update(m._pending)
            m._pending.clear()
        m._row = row
        step = m.step_index
        for hook in m._start_hooks:
            try:
                hook(step)
            except Exception as exc:  # noqa: BLE001 - a collector never breaks the loop
                m.collector_failed(hook, exc)
        if m.cuda_timer is not None:
            m.cuda_timer.step_start(step)
        self._t0 = _perf()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        t1 = _perf()
        m = self._m
        row = m._row
        m._row = None
        m.current_phase = None
        if row is None:
            return
        step = m.step_index
        if "step" in row or "time" in row or "duration_s" in row:  # logged under a name of ours
            m._rename_own(row)
        row["step"] = step
        row["time"] = _time()
        row["duration_s"] = t1 - self._t0
        if self.samples is not None:
            row["samples"] = self.samples
        if self.tokens is not None:
            row["tokens"] = self.tokens
        if et is not None:
            # a failed step (e.g. an OOM the trainer will retry) is not a step;
            # the caller records what happened. Undo sampling state.
            for hook in m._end_hooks:
                try:
                    hook(step, {"step": step, "time": row["time"], "duration_s": row["duration_s"], "failed": 1})
                except Exception as exc:  # noqa: BLE001
                    m.collector_failed(hook, exc)
            m._mem = None
            return
        for hook in m._end_hooks:
            try:
                hook(step, row)
            except Exception as exc:  # noqa: BLE001
                m.collector_failed(hook, exc)
        if m._mem is not None:
            m._emit_memory()
        if m.cuda_timer is not None:
            m.cuda_timer.step_end(step, row)  # the timer hands the row to put_step once its events resolve
        else:
            m.put_step(row)
        m.step_index = step + 1


class Monitor:
    """Records one process's view of a training run into ``run_dir``.

    ``run_dir`` is created if needed. Several processes (torchrun ranks) may
    share one; each writes ``rank<RANK>.db``. Use as a context manager or call
    :meth:`close`; on exceptions, Ctrl-C, SIGTERM and interpreter exit the
    Monitor flushes and records why the run ended. ``total_steps``: the steps
    the run will take, when known (progress and ETA; see :meth:`set_total_steps`).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        name: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        config: dict[str, Any] | None = None,
        total_steps: int | None = None,
        options: MonitorOptions | None = None,
        **option_overrides: Any,
    ) -> None:
        if options is None:
            options = MonitorOptions(**option_overrides)
        elif option_overrides:
            raise TypeError("pass either options= or keyword options, not both")
        _check_total(total_steps)
        self.options = options
        env_rank, env_world = _rank_from_env()
        self.rank = env_rank if rank is None else rank
        self.world_size = env_world if world_size is None else world_size
        self.run_dir = Path(run_dir)
        self.name = name or self.run_dir.name
        self.step_index = 0
        self.total_steps: int | None = None
        self.current_phase: str | None = None
        self.cuda_timer: StepTimer | None = None
        self._row: dict[str, Any] | None = None
        self._pending: dict[str, Any] = {}
        self._mem: dict[str, Any] | None = None
        self._start_hooks: list[StepStartHook] = []
        self._end_hooks: list[StepEndHook] = []
        self._phase_end_hooks: list[PhaseEndHook] = []
        self._unavailable: set[str] = set()
        self._closed = False
        self._lock = threading.Lock()
        self._phases: dict[str, _Phase] = {}
        self._names: dict[str, dict[str, str]] = {"steps": {}, "memory": {}}  # user name -> stored name
        self._step_ctx = _Step(self)
        env = describe_environment()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_run_meta(self.run_dir, {
                "name": self.name,
                "run_id": uuid.uuid4().hex[:12],
                "created_at": time.time(),
                "world_size": self.world_size,
                "gpudash_version": __version__,
                "argv": sys.argv,
            })
            meta = {"name": self.name, "world_size": self.world_size, "argv": sys.argv, **env}
            if config:
                meta["config"] = config
            self.recorder = Recorder(self.run_dir, rank=self.rank, flush_interval=options.flush_interval,
                                     capacity=options.buffer_records, meta=meta)
        except OPEN_ERRORS as exc:
            raise RunError(f"{self.run_dir}: cannot record a run here ({exc}); pass a writable run directory "
                           f"to gpudash.Monitor") from exc
        if total_steps is not None:
            self.set_total_steps(total_steps)
        self.collectors: list[Collector] = []
        if env.get("cuda_available") and "device_capacity_bytes" not in env:
            self.add_step_hooks(end=self._record_cuda_device)
        for collector in default_collectors(options):
            self.add_collector(collector)
        self._alerts: Any = None
        if options.alerts is not None and self.rank == 0:  # rank 0 watches every rank's files
            from gpudash.alerts.watch import start_alerts

            self._alerts = start_alerts(self)
        self._install_exit_handlers()

    # ---- the recording interface collectors use (gpudash.collectors.api.Recording) -------
    def add_collector(self, collector: Collector) -> None:
        try:
            collector.start(self)
        except Exception as exc:  # noqa: BLE001
            self.unavailable(getattr(collector, "name", type(collector).__name__), f"failed to start: {exc}")
            return
        self.collectors.append(collector)

    def add_step_hooks(self, start: StepStartHook | None = None, end: StepEndHook | None = None,
                       phase_end: PhaseEndHook | None = None) -> None:
        """Register training-thread hooks; they must be cheap and must not block."""
        if start is not None:
            self._start_hooks.append(start)
        if end is not None:
            self._end_hooks.append(end)
        if phase_end is not None:
            self._phase_end_hooks.append(phase_end)

    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue one record for ``table`` (never blocks). Step rows go through :meth:`put_step`."""
        self.recorder.put(table, row)

    def put_step(self, row: dict[str, Any]) -> None:
        """Write one finished step's row: the only writer of the ``steps`` table (called at
        step end, or by the CUDA timer once the step's GPU times are known)."""
        self.recorder.put("steps", row)

    def _record_cuda_device(self, step: int, row: dict[str, Any]) -> None:
        """Record the CUDA device once the user's code has initialised CUDA."""
        from gpudash.collectors.base import try_import_torch

        meta = cuda_device_meta(try_import_torch())
        if meta:
            self.recorder.put_meta(**meta)
            self._end_hooks.remove(self._record_cuda_device)

    def unavailable(self, source: str, reason: str) -> None:
        """Record once that a source records nothing here, and why."""
        with self._lock:
            if source in self._unavailable:
                return
            self._unavailable.add(source)
        self.recorder.put_meta(**{f"unavailable_{column_name(source)}": reason})
        self.event("collector_unavailable", f"{source}: {reason}", source=source)

    def collector_failed(self, where: Any, exc: BaseException) -> None:
        name = getattr(getattr(where, "__self__", None), "name", None) or getattr(where, "__name__", "collector")
        self.unavailable(str(name), f"stopped after an error: {type(exc).__name__}: {exc}")
        for hooks in (self._start_hooks, self._end_hooks, self._phase_end_hooks):
            if where in hooks:
                hooks.remove(where)

    # ---- the training loop API ----------------------------------------------------------
    def step(self, samples: Any = None, tokens: Any = None) -> _Step:
        """Time one training step: ``with monitor.step(samples=B, tokens=B*T): ...``."""
        ctx = self._step_ctx
        ctx.samples = samples
        ctx.tokens = tokens
        return ctx

    def phase(self, name: str) -> _Phase:
        """Time a part of the step (data, forward, backward, optimizer, ...); nests and repeats add up."""
        ph = self._phases.get(name)
        if ph is None:
            ph = self._phases[name] = _Phase(self, name)
            # the run's phase set is what was opened (analysis never guesses it from a column suffix)
            self.recorder.put_meta(phases=[p.key.removesuffix("_s") for p in self._phases.values()])
        return ph

    def log(self, **scalars: Any) -> None:
        """Record scalars for the current step (or the next one, outside a step).
        Tensors are fine: they are detached here and read by the writer thread."""
        row = self._row if self._row is not None else self._pending
        if _PLAIN.issuperset(map(type, scalars.values())):  # plain numbers: nothing to detach
            row.update(scalars)
            return
        for k, v in scalars.items():
            detach = getattr(v, "detach", None)
            row[k] = detach() if detach is not None else v

    def _rename_own(self, row: dict[str, Any]) -> None:
        for c in _OWN_COLUMNS["steps"]:
            if c in row:
                row[self._user_name("steps", c)] = row.pop(c)

    def _user_name(self, table: str, key: str) -> str:
        """The name a logged value is stored under: its own, unless gpudash uses that column
        itself (``step``, ``time``, ``rank``, ``loss__min``...); then a renamed one, said once.
        (Names the reader or the roll-ups use are also renamed by the writer, for every source.)"""
        names = self._names[table]
        known = names.get(key)
        if known is not None:
            return known
        col = column_name(key)
        name = key
        if is_reserved_column(col) or col in _OWN_COLUMNS[table]:
            name = namespaced_column(col)
            where = "log" if table == "steps" else "log_memory"
            msg = (f"monitor.{where}({key[:60]!r}=...): {col!r} is a name gpudash uses itself; "
                   f"recorded as {name!r} (rename it to silence this)")
            print(f"gpudash: {msg}", file=sys.stderr)
            self.event("reserved_name", msg, name=key[:200], stored_as=name)
        if len(names) < _MAX_NAMES:
            names[key] = name
        return name

    def log_memory(self, **values: Any) -> None:
        """Add byte counts (e.g. ``offload_bytes``) to this step's memory record."""
        self.memory_row(self.step_index, {self._user_name("memory", k): v for k, v in values.items()})

    def memory_row(self, step: int, values: dict[str, Any]) -> None:
        if self._mem is None:
            self._mem = {"step": step, "time": time.time()}
        self._mem.update(values)

    def _emit_memory(self) -> None:
        mem = self._mem
        if mem is None:
            return
        self._mem = None
        if "allocated_bytes" in mem and any(c in mem for c in _CATEGORIES):
            known = sum(int(mem.get(c) or 0) for c in _CATEGORIES)
            if "peak_bytes" not in mem:
                mem["other_bytes"] = max(0, int(mem["allocated_bytes"]) - known)
            elif all(c in mem for c in _CATEGORIES):  # categories describe the peak: the rest of it
                mem["other_bytes"] = max(0, int(mem["peak_bytes"]) - known)
        self.recorder.put("memory", mem)

    def watch(self, model: Any, optimizer: Any = None) -> None:
        """Record memory by category (parameters, gradients, optimizer state, activations)."""
        o = self.options
        self.add_collector(CategoryCollector(model, optimizer, memory_every=o.memory_every,
                                             activations_every=o.activations_every,
                                             activations_budget=o.activations_budget))

    def event(self, kind: str, message: str, **data: Any) -> None:
        """Record something that happened (OOM, batch-size change, fallback, ...)."""
        self.recorder.put("events", {"time": time.time(), "step": self.step_index, "kind": kind,
                                     "message": message, "data": data or None})

    def set_meta(self, **items: Any) -> None:
        """Store run-level facts (config, estimator prediction, pre-flight checks...)."""
        self.recorder.put_meta(**items)

    def set_total_steps(self, total: int) -> None:
        """Say how many steps the run will take (its progress and ETA on every surface); call it again when
        that changes. Raises ``ValueError`` for anything but a whole number >= 1."""
        _check_total(total)
        self.total_steps = int(total)
        self.recorder.put_meta(total_steps=self.total_steps)

    # ---- ending ---------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything recorded so far (blocks; not for the training loop)."""
        if self.cuda_timer is not None:
            self.cuda_timer.drain()
        return self.recorder.flush(timeout)

    def close(self, status: str = "finished", reason: str = "closed") -> None:
        """Stop the collectors, flush everything, and mark the run ``status``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for c in reversed(self.collectors):
            try:
                c.stop()
            except Exception:  # noqa: BLE001 - closing must always reach the writer
                pass
        if self.cuda_timer is not None:
            try:
                self.cuda_timer.drain()
            except Exception:  # noqa: BLE001
                pass
        if self._alerts is not None:  # the last look (a crash alert) is recorded before the writer closes
            self._alerts.finish(status, reason, flush=self.recorder.flush)
        self.recorder.close(status=status, reason=reason)
        if self._alerts is not None:
            self._alerts.close()
        self._remove_exit_handlers()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        elif issubclass(et, KeyboardInterrupt):
            self.close("crashed", "KeyboardInterrupt")
        else:
            self.close("crashed", f"exception: {et.__name__}: {ev}")

    # ---- exit paths -----------------------------------------------------------------------
    def _install_exit_handlers(self) -> None:
        atexit.register(self._atexit)
        self._prev_excepthook = sys.excepthook
        monitor = self

        def excepthook(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> None:
            if issubclass(et, KeyboardInterrupt):
                monitor.close("crashed", "KeyboardInterrupt")
            else:
                monitor.close("crashed", f"exception: {et.__name__}: {ev}")
            monitor._prev_excepthook(et, ev, tb)

        self._excepthook = excepthook
        sys.excepthook = excepthook
        self._prev_sigterm: Any = None
        if self.options.handle_signals and threading.current_thread() is threading.main_thread():
            try:
                prev = signal.getsignal(signal.SIGTERM)
                if prev in (signal.SIG_DFL, None):
                    signal.signal(signal.SIGTERM, self._on_sigterm)
                    self._prev_sigterm = prev
            except (ValueError, OSError):
                pass

    def _remove_exit_handlers(self) -> None:
        atexit.unregister(self._atexit)
        if sys.excepthook is self._excepthook:
            sys.excepthook = self._prev_excepthook
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    signal.signal(signal.SIGTERM, self._prev_sigterm)
            except (ValueError, OSError):
                pass

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.close("crashed", "SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _atexit(self) -> None:
        self.close("finished", "process exited without close()")
