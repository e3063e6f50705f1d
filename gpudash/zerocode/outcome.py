"""The job's last word under ``gpudash run``: no job ends without a recorded step and nothing said.

Standard library only at load: the boot module and the agent load it by path in every process of the
job. Each process that imports torch under ``gpudash run`` leaves a small state file in the job's state
folder (``GPUDASH_RUN_STATE``, made by ``gpudash run``): that it imported torch, then at its exit how many
steps it recorded, whether a framework callback took over, why it recorded none, or why recording failed.
The job's first process (or ``gpudash run`` itself, when it waits for the job) reads them all when the job
is over (:func:`job_done`): when no process recorded a step it says why on stderr, one ``gpudash:`` line,
and leaves the run folder with a ``no_steps`` event and ``no_steps_reason`` naming the cause:

- torch never imported (by any process of the job);
- torch imported but not seen by gpudash run's hook (imported before it, or through an import hook that
  bypassed it);
- torch imported but no optimizer stepped and no ``backward()`` ran (the script only evaluated, or
  trained in a way gpudash run cannot see);
- recording failed: the cause.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

ENV_STATE = "GPUDASH_RUN_STATE"
ENV_ROOT = "GPUDASH_RUN_ROOT"

__all__ = ["ENV_ROOT", "ENV_STATE", "job_done", "no_steps_reason", "read_states", "report"]

NEVER_IMPORTED = ("the script never imported torch, so there was nothing to record (gpudash run records PyTorch "
                  "training: a step is one optimizer step, or one backward() without an optimizer)")
UNSEEN = ("torch was imported where gpudash run's import hook could not see it (before it loaded, or through "
          "another import hook): nothing was recorded; please report the command to gpudash")
NOT_TRAINED = ("torch was imported ({n} process(es)) but no optimizer stepped and no backward() ran where "
               "gpudash run could see it: nothing trained (a step is one optimizer step, or one backward() "
               "without an optimizer)")


def _say(message: str) -> None:
    try:
        print(f"gpudash: {message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr must not break the script
        pass


def report(**state: Any) -> None:
    """Record this process's state for the job's last word (replacing what it said before); never raises."""
    folder = os.environ.get(ENV_STATE)
    if not folder:
        return
    try:
        path = os.path.join(folder, f"{os.getpid()}.json")
        from gpudash.store.atomic import write_atomic

        write_atomic(path, json.dumps({"pid": os.getpid(), **state}))
    except (OSError, TypeError, ValueError):
        pass  # the folder is gone (the job is over) or unwritable: the last word falls back to what it sees


def read_states(folder: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(state, dict):
            out.append(state)
    return out


def no_steps_reason(states: list[dict[str, Any]], torch_unseen: bool = False) -> tuple[str | None, bool]:
    """(why no step was recorded, whether a run folder already holds that reason); (None, True) when some
    process recorded a step or handed recording to a framework callback."""
    if any(s.get("steps") or s.get("delegated") for s in states):
        return None, True
    if any(s.get("opened") for s in states):  # the state written at exit replaces this one
        # opened its run and never said how it ended (killed): its run folder holds what it recorded
        return None, True
    failed = [s for s in states if s.get("failed")]
    if failed:
        return f"recording failed: {failed[0]['failed']}", bool(failed[0].get("written"))
    told = [s for s in states if s.get("no_steps")]
    if told:  # a process opened the run and wrote its no_steps event (it evaluated, say)
        return str(told[0]["no_steps"]), bool(told[0].get("written"))
    torch = [s for s in states if s.get("torch")]
    if torch:
        return NOT_TRAINED.format(n=len(torch)), False
    return (UNSEEN if torch_unseen else NEVER_IMPORTED), False


def write_no_steps(run_dir: str, why: str, crashed: dict[str, Any] | None = None) -> None:
    """A run folder whose only record is the ``no_steps`` event: written with the store's own writer (a Monitor
    would import torch into a process that is exiting). ``crashed``: the job was killed (its end-cause meta);
    the run is closed as crashed with ``why`` as its end reason."""
    import time
    import uuid
    from pathlib import Path

    from gpudash._version import __version__
    from gpudash.store.meta import write_run_meta
    from gpudash.store.objstore import is_url, local_staging, run_name
    from gpudash.store.writer import Recorder

    url = run_dir.rstrip("/") if is_url(run_dir) else None
    local = local_staging(url) if url else Path(run_dir)
    name = run_name(url) if url else local.name
    local.mkdir(parents=True, exist_ok=True)
    write_run_meta(local, {"name": name, "run_id": uuid.uuid4().hex[:12], "created_at": time.time(), "world_size": 1,
                           "gpudash_version": __version__, "argv": sys.argv})
    rec = Recorder(local, rank=0, meta={"name": name, "world_size": 1, "argv": sys.argv,
                                        "config": {"recorded_by": "gpudash run"}}, publish_to=url)
    rec.put_meta(no_steps_reason=why, **(crashed or {}))
    rec.put("events", {"time": time.time(), "step": 0, "kind": "no_steps", "message": why, "data": None})
    rec.close("crashed" if crashed is not None else "finished", why)


def job_done(run_dir: str | None = None, folder: str | None = None, exit_code: int | None = None,
             in_job: bool = False) -> str | None:
    """The job is over: when no process recorded a step, say why and make sure the run folder says it too.
    Returns the reason (None when steps were recorded). Removes the state folder. ``in_job``: called by
    the job's first process itself at its exit (else by ``gpudash run`` waiting for it)."""
    run_dir = run_dir or os.environ.get("GPUDASH_RUN_DIR")
    folder = folder or os.environ.get(ENV_STATE)
    states = read_states(folder) if folder else []
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    unseen = in_job and "torch" in sys.modules and not any(s.get("pid") == os.getpid() for s in states)
    why, written = no_steps_reason(states, torch_unseen=unseen)
    if why is None:
        return None
    crashed = getattr(sys, "last_value", None) if in_job else None
    if crashed is not None:
        why += f" (the script ended with {type(crashed).__name__} first)"
    elif exit_code:
        why += f" (the command exited with code {exit_code})"
    if not written and run_dir:
        try:
            write_no_steps(run_dir, why)
        except Exception as exc:  # noqa: BLE001 - the message below still says why
            _say(f"could not write the no_steps event into {run_dir} ({type(exc).__name__}: {exc})")
    _say(f"no step recorded: {why}")
    return why
