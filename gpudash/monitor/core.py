"""The Monitor class: its constructor, the recording interface collectors use
(:class:`gpudash.collectors.api.Recording`), the training-loop API and the end of a run.

The step and phase timers are in :mod:`gpudash.monitor.timing`, the naming rule
for logged values in :mod:`~gpudash.monitor.names`, the memory record in
:mod:`~gpudash.monitor.memory_rows`, the exit paths in :mod:`~gpudash.monitor.exits`.
"""

from __future__ import annotations

import numbers
import os
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
from gpudash.collectors.env import cuda_device_meta, describe_environment, placement
from gpudash.errors import RunError
from gpudash.monitor.exits import ExitHandlers, exception_status
from gpudash.monitor.memory_rows import MemoryRow
from gpudash.monitor.names import StoredNames
from gpudash.monitor.resume import NO_RESUME, NoResume, ResumeNote
from gpudash.monitor.timing import NEVER, NOWHERE, HookedPhase, Phase, Step, innermost
from gpudash.options import MonitorOptions
from gpudash.store.meta import write_run_meta
from gpudash.store.objstore import is_url, local_staging, run_name
from gpudash.store.schema import column_name
from gpudash.store.steplog import mark_unpacked
from gpudash.store.writer import OPEN_ERRORS, Recorder

if TYPE_CHECKING:
    from gpudash.collectors.api import Collector, PhaseEndHook, PhaseStartHook, StepDueHook, StepEndHook, StepStartHook

__all__ = ["Monitor"]

#: Phase names a Monitor remembers (and lists in the run meta); a phase named past them is still timed.
MAX_PHASES = 256
#: Values ``log()`` stores as they are (no ``detach``): checked for all of a call's values at once, in C.
_PLAIN = frozenset({float, int, bool, str, type(None)})


def _check_total(total: Any) -> None:
    if total is not None and (isinstance(total, bool) or not isinstance(total, numbers.Integral) or total < 1):
        raise ValueError(f"total_steps={total!r}: pass the number of steps the run will take (a whole number >= 1)")


class _NoAlerts:
    """The alert watcher of a Monitor that watches none (alerts off, or not rank 0)."""

    def finish(self, status: str, reason: str, flush: Any = None) -> None:
        pass

    def close(self) -> None:
        pass


_NO_ALERTS = _NoAlerts()


class Monitor:
    """Records one process's view of a training run into ``run_dir``.

    ``run_dir`` is created if needed. Several processes (torchrun ranks) may
    share one; each writes ``rank<RANK>.db``. Use as a context manager or call
    :meth:`close`; on exceptions, Ctrl-C, SIGTERM and interpreter exit the
    Monitor flushes and records why the run ended. ``total_steps``: the steps
    the run will take, when known (progress and ETA; see :meth:`set_total_steps`).

    A ``run_dir`` some earlier process recorded (a preempted job resumed from its
    checkpoint) is recorded as its next *attempt* (:mod:`gpudash.store.attempts`):
    with ``resume=True`` the steps continue after the last one recorded, unless
    ``monitor.step(step=k)`` or :meth:`resume_at` says where the script resumed;
    the steps a new attempt redoes supersede the earlier ones in every view. A
    process that is still recording the same rank there makes this raise
    :class:`RunError`.
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
        resume: bool = False,
        options: MonitorOptions | None = None,
        **option_overrides: Any,
    ) -> None:
        if options is None:
            options = MonitorOptions(**option_overrides)
        elif option_overrides:
            raise TypeError("pass either options= or keyword options, not both")
        _check_total(total_steps)
        self.options = options
        where = placement()
        self.rank = where.rank if rank is None else rank
        self.world_size = where.world_size if world_size is None else world_size
        #: an object-store URL (``s3://bucket/runs/exp1``): recorded in a local staging folder (``run_dir``)
        #: and published there as segments by the writer's uploader thread
        self.url = str(run_dir).rstrip("/") if is_url(run_dir) else None
        self.run_dir = local_staging(self.url) if self.url else Path(run_dir)
        self.name = name or (run_name(self.url) if self.url else self.run_dir.name)
        self.step_index = 0
        self.total_steps: int | None = None
        self._row: dict[str, Any] = NOWHERE  # the open step's row (phases add to it); NOWHERE between steps
        self._pending: dict[str, Any] = {}  # what is logged between steps: the next step's row
        self._into = self._pending  # where log() writes: the open step's row, else _pending
        self._memory = MemoryRow()
        self._start_hooks: list[StepStartHook] = []
        self._end_hooks: list[StepEndHook] = []
        self._phase_start_hooks: list[PhaseStartHook] = []
        self._phase_end_hooks: list[PhaseEndHook] = []
        self._due_hooks: dict[StepDueHook, int] = {}  # end hooks for some steps: the step each asked for next
        self._due = NEVER  # the first of those steps
        #: the first step whose end runs :meth:`end_step` (end hooks, due hooks, a memory record): 0 while there are
        #: end hooks or a memory record, else ``_due`` (one comparison a step when there is nothing to do)
        self._slow_from = NEVER
        self._unavailable: set[str] = set()
        self._closed = False
        self._lock = threading.Lock()
        self._phases: dict[str, Phase] = {}
        self._names = StoredNames(self.event)
        self._step_ctx = Step(self)
        env = describe_environment(where)
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
                                     capacity=options.buffer_records, meta=meta, publish_to=self.url)
        except OPEN_ERRORS as exc:
            raise RunError(f"{self.run_dir}: cannot record a run here ({exc}); pass a writable run directory "
                           f"to gpudash.Monitor") from exc
        #: where each step's row goes (:meth:`put_step`, without the method's own call: every step pays it)
        self._put_step = self.recorder.steps.put
        #: this process's attempt at the run (1 unless the rank's records were there before it)
        self.attempt = self.recorder.attempt
        self._resume: ResumeNote | NoResume = NO_RESUME
        if self.recorder.previous is not None:
            self._resume = note = ResumeNote(self.recorder.previous, self.attempt, time.time(), resume)
            self.step_index = note.step
            self.add_step_hooks(start=self._announce_resume)
        if total_steps is not None:
            self.set_total_steps(total_steps)
        for problem in where.problems:  # a launcher's bad value is a recorded state, never a traceback
            print(f"gpudash: {problem}", file=sys.stderr)
            self.event("bad_environment", problem)
        self.collectors: list[Collector] = []
        if env.get("cuda_available") and "device_capacity_bytes" not in env:
            self.add_step_hooks(end=self._record_cuda_device)
        for collector in default_collectors(options):
            self.add_collector(collector)
        # the leak watch: its window takes the rows as they are recorded (from the first), its thread judges them
        self._leak_watch: Any = None
        if options.leak_poll_s > 0:
            try:
                from gpudash.monitor.leakwatch import LeakWatch

                self._leak_watch = LeakWatch(self, options.leak_poll_s)
            except Exception as exc:  # noqa: BLE001 - the run goes on without it, and says so
                self.unavailable("leak_watch", f"failed to start: {type(exc).__name__}: {exc}")
        self._alerts: Any = _NO_ALERTS
        if options.alerts is not None and self.rank == 0:  # rank 0 watches every rank's files
            # here, not on that thread: the watcher starts at the end of what is recorded so far
            from gpudash.alerts.watch import start_alerts

            self._alerts = start_alerts(self) or _NO_ALERTS
        self._exits = ExitHandlers(self.close, handle_signals=options.handle_signals)

    @property
    def _leaks(self) -> Any:
        """The leak watch (None when off)."""
        return self._leak_watch

    # ---- the recording interface collectors use (gpudash.collectors.api.Recording) -------
    def add_collector(self, collector: Collector) -> None:
        try:
            collector.start(self)
        except Exception as exc:  # noqa: BLE001
            self.unavailable(getattr(collector, "name", type(collector).__name__), f"failed to start: {exc}")
            return
        self.collectors.append(collector)

    def add_step_hooks(self, start: StepStartHook | None = None, end: StepEndHook | None = None,
                       phase_end: PhaseEndHook | None = None, phase_start: PhaseStartHook | None = None,
                       end_due: StepDueHook | None = None) -> None:
        """Register training-thread hooks; they must be cheap and must not block. An ``end`` hook
        that returns True holds the row and hands it to :meth:`put_step` itself; an ``end_due`` hook runs
        at the end of the steps it asks for (it returns the next one: a sampler's steps between cost nothing)."""
        # the lists are replaced, never changed in place: a hook added or removed while the step runs
        # its hooks takes effect at the next step, and no hook of this one is skipped
        if start is not None:
            self._start_hooks = [*self._start_hooks, start]
        if end is not None:
            self._end_hooks = [*self._end_hooks, end]
        if phase_start is not None:
            self._phase_start_hooks = [*self._phase_start_hooks, phase_start]
        if phase_end is not None:
            self._phase_end_hooks = [*self._phase_end_hooks, phase_end]
        if end_due is not None:
            self._due_hooks = {**self._due_hooks, end_due: self.step_index}
            self._due = min(self._due_hooks.values())
        self._retype_phases()
        self._reslow()

    def _remove_hook(self, hook: Any) -> None:
        self._start_hooks = [h for h in self._start_hooks if h != hook]
        self._end_hooks = [h for h in self._end_hooks if h != hook]
        self._phase_start_hooks = [h for h in self._phase_start_hooks if h != hook]
        self._phase_end_hooks = [h for h in self._phase_end_hooks if h != hook]
        if hook in self._due_hooks:
            self._due_hooks = {h: at for h, at in self._due_hooks.items() if h != hook}
            self._due = min(self._due_hooks.values(), default=NEVER)
        self._retype_phases()
        self._reslow()

    def _reslow(self) -> None:
        self._slow_from = 0 if self._end_hooks or self._memory.row is not None else self._due

    def end_step(self, step: int, row: dict[str, Any]) -> None:
        """The end of a step with something to run (:class:`Step` calls this from ``_slow_from`` on): the end
        hooks, the due hooks whose step it is, the step's memory record; then the row is written unless an end
        hook took it."""
        taken = False
        for hook in self._end_hooks:
            try:
                if hook(step, row):  # True: the hook holds the row and hands it to put_step itself
                    taken = True
            except Exception as exc:  # noqa: BLE001 - a collector never breaks the loop
                self.collector_failed(hook, exc)
        if step >= self._due:
            self.run_due_hooks(step, row)
        memory = self._memory
        if memory.row is not None:
            self.recorder.put("memory", memory.take())
        if not taken:
            self.put_step(row)
        self._reslow()

    def run_due_hooks(self, step: int, row: dict[str, Any]) -> None:
        """The end of a step some ``end_due`` hook asked for (:meth:`end_step` calls this only then)."""
        due = dict(self._due_hooks)
        for hook, at in self._due_hooks.items():
            if step >= at:
                try:
                    due[hook] = max(step + 1, int(hook(step, row)))
                except Exception as exc:  # noqa: BLE001 - a collector never breaks the loop
                    due.pop(hook, None)
                    self.collector_failed(hook, exc)
        self._due_hooks = {h: at for h, at in due.items() if h in self._due_hooks}
        self._due = min(self._due_hooks.values(), default=NEVER)
        self._reslow()

    def _phase_class(self) -> type[Phase]:
        return HookedPhase if self._phase_start_hooks or self._phase_end_hooks else Phase

    def _retype_phases(self) -> None:
        """Phases run the hook lists only while there are phase hooks (most runs have none)."""
        cls = self._phase_class()
        for ph in self._phases.values():
            if type(ph) is not cls:
                ph.__class__ = cls

    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue one record for ``table`` (never blocks). Step rows go through :meth:`put_step`."""
        self.recorder.put(table, row)

    def put_step(self, row: dict[str, Any]) -> None:
        """Write one finished step's row: the only writer of the ``steps`` table (called at
        step end, or by the CUDA timer once the step's GPU times are known). A row holding anything but
        plain numbers must be marked first (:func:`gpudash.store.steplog.mark_unpacked`): ``log`` and the
        step's ``samples``/``tokens`` do it."""
        self._put_step(row)

    def _record_cuda_device(self, step: int, row: dict[str, Any]) -> None:
        """Record the CUDA device once the user's code has initialised CUDA."""
        from gpudash.collectors.base import try_import_torch

        meta = cuda_device_meta(try_import_torch())
        if meta:
            self.recorder.put_meta(**meta)
            self._remove_hook(self._record_cuda_device)

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
        self._remove_hook(where)

    # ---- the training loop API ----------------------------------------------------------
    def step(self, samples: Any = None, tokens: Any = None, step: int | None = None) -> Step:
        """Time one training step: ``with monitor.step(samples=B, tokens=B*T): ...``. ``step``: this step's
        number (a resumed script's own count); the steps after it count on from there."""
        if step is not None:
            self.resume_at(step, "monitor.step(step=k)")
        ctx = self._step_ctx
        ctx.samples = samples
        ctx.tokens = tokens
        return ctx

    def phase(self, name: str) -> Phase:
        """Time a part of the step (data, forward, backward, optimizer, ...); nests and repeats add up."""
        try:
            return self._phases[name]
        except KeyError:
            return self._new_phase(name)

    @property
    def current_phase(self) -> str | None:
        """The innermost open ``monitor.phase(...)``, or None."""
        return innermost(self._phases.values())

    def _new_phase(self, name: str) -> Phase:
        ph = self._phase_class()(self, name)
        if len(self._phases) >= MAX_PHASES:  # ever-new names: timed, not remembered (bounded memory)
            return ph
        self._phases[name] = ph
        # the run's phase set is what was opened (analysis never guesses it from a column suffix)
        self.recorder.put_meta(phases=[p.key.removesuffix("_s") for p in self._phases.values()])
        return ph

    def resume_at(self, step: int, source: str) -> None:
        """The next step is number ``step`` (a script resumed from a checkpoint); ``source`` says what told it
        (recorded in this attempt's ``resume`` event)."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"step={step!r}: pass the step's number (a whole number >= 0)")
        self.step_index = int(step)
        self._resume.at(int(step), source)

    def _announce_resume(self, step: int) -> None:
        """The first step of a new attempt: record where it resumed (once)."""
        self._remove_hook(self._announce_resume)
        note = self._resume
        if note.done or not isinstance(note, ResumeNote):  # (NoResume is always done)
            return
        msg, data = note.event(step)
        print(f"gpudash: {self.name}: {msg}", file=sys.stderr)
        self.recorder.put("events", {"time": note.started_at, "step": step, "kind": "resume", "message": msg,
                                     "data": data})

    def log(self, **scalars: Any) -> None:
        """Record scalars for the current step (or the next one, outside a step).
        Tensors are fine: a one-value CPU tensor is read here (no device to wait for; the tensor is let go at
        once), any other is detached here and read by the writer thread (a GPU value never waits on the
        training thread)."""
        row = self._into
        if _PLAIN.issuperset(map(type, scalars.values())):  # plain numbers: nothing to detach
            row.update(scalars)
            return
        for k, v in scalars.items():
            detach = getattr(v, "detach", None)
            if detach is None:
                row[k] = v
                if v.__class__ not in _PLAIN:  # (a numpy number, an object: the writer converts it)
                    mark_unpacked(row)
            elif getattr(v, "is_cpu", False) and v.numel() == 1:
                row[k] = v.item()
            else:
                row[k] = detach()
                mark_unpacked(row)  # (a tensor is never packed on this thread: its __float__ would wait for the GPU)

    def log_memory(self, **values: Any) -> None:
        """Add byte counts (e.g. ``offload_bytes``) to this step's memory record."""
        self.memory_row(self.step_index, {self._names.stored("memory", k): v for k, v in values.items()})

    def memory_row(self, step: int, values: dict[str, Any]) -> None:
        """Add byte counts to the memory record of ``step`` (written as the step ends)."""
        self._memory.add(step, values)
        self._slow_from = 0

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
        for c in self.collectors:  # collectors that hold records (the CUDA timer's rows) write them now
            drain = getattr(c, "drain", None)
            if drain is not None:
                try:
                    drain()
                except Exception as exc:  # noqa: BLE001
                    self.collector_failed(drain, exc)
        return self.recorder.flush(timeout)

    def close(self, status: str = "finished", reason: str = "closed") -> None:
        """Stop the collectors, flush everything, and mark the run ``status``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self._resume.done:  # an attempt that took no step still says it began
            self._announce_resume(self.step_index)
        for c in reversed(self.collectors):
            try:
                c.stop()
            except Exception:  # noqa: BLE001 - closing must always reach the writer
                pass
        leaks = self._leak_watch
        if leaks is not None:
            leaks.stop()
        # the last look (a crash alert) is recorded before the writer closes
        self._alerts.finish(status, reason, flush=self.recorder.flush)
        self.recorder.close(status=status, reason=reason)
        self._alerts.close()
        self._exits.remove()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.close(*exception_status(et, ev))
