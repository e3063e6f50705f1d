"""Loaded by ``site`` at the start of every Python process ``gpudash run`` starts
(this folder is first on the child's PYTHONPATH), before any user code.

Standard library only, and it does nothing until the script imports torch:
then it loads gpudash's agent (``../agent.py``, by path, so that a process
that only imports torch does not import all of gpudash) and hands it the module.
It also tells the agent when transformers' and Lightning's trainers and
gpudash's Monitor are imported. It then steps off ``sys.path`` and runs the
``sitecustomize`` that would have run without it, if any.

A watched module is watched until it has been *executed*, not until someone first
looks it up: ``importlib.util.find_spec('torch')`` (what transformers, datasets and
accelerate do before they import torch) gets a spec whose loader tells the agent if
it is ever used, and the real import that follows is still seen.

In the job's first process (the one ``gpudash run`` became) it also registers the
job's last word at exit (``../outcome.py``): a job that recorded no step says why on
stderr and leaves a run folder with a ``no_steps`` event.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_AGENT_FILE = os.path.join(os.path.dirname(_HERE), "agent.py")
_AGENT_NAME = "_gpudash_zerocode_agent"
_OUTCOME_FILE = os.path.join(os.path.dirname(_HERE), "outcome.py")
_OUTCOME_NAME = "_gpudash_zerocode_outcome"
_WATCHED = ("torch", "gpudash.monitor", "transformers.trainer", "lightning.pytorch.trainer.trainer")


def _load(name: str, path: str) -> Any:
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def _agent() -> Any:
    return _load(_AGENT_NAME, _AGENT_FILE)


def _imported(name: str, module: Any) -> None:
    try:
        _agent().on_import(name, module)
    except Exception as exc:  # noqa: BLE001 - gpudash failing never changes what the script does
        try:
            print(f"gpudash: not recording ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass


class _Loader:
    """Runs the real loader, then tells the agent; puts the real loader back on the module."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        if _FINDER.done(self._name):  # once, even when two specs of it were handed out
            _imported(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)


class _WhenImported:
    """A meta path finder that only wraps the loaders of the few modules the agent watches."""

    def __init__(self) -> None:
        self.pending = set(_WATCHED)
        self._finding: set[str] = set()

    def done(self, name: str) -> bool:
        """``name`` has been executed: stop watching it; False when it already was."""
        if name not in self.pending:
            return False
        self.pending.discard(name)
        return True

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        # watched until executed: a lookup (importlib.util.find_spec) does not end the watch
        if name not in self.pending or name in self._finding:
            return None
        self._finding.add(name)
        try:
            return self._find(name, path, target)
        finally:
            self._finding.discard(name)

    def _find(self, name: str, path: Any, target: Any) -> Any:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, name)
        return spec


_FINDER = _WhenImported()
_RUN_DIR = os.environ.get("GPUDASH_RUN_DIR")  # the agent takes it out of the environment once it records


def _job_done() -> None:
    """The job's first process exits: say why when no process of the job recorded a step."""
    if _FINDER in sys.meta_path:  # what the last word imports is not the script's
        sys.meta_path.remove(_FINDER)
    try:
        _load(_OUTCOME_NAME, _OUTCOME_FILE).job_done(_RUN_DIR, in_job=True)
    except Exception as exc:  # noqa: BLE001
        try:
            print(f"gpudash: could not check the run's steps ({type(exc).__name__}: {exc})", file=sys.stderr,
                  flush=True)
        except Exception:  # noqa: BLE001
            pass


def _boot() -> None:
    if os.environ.get("GPUDASH_RUN_DIR"):
        sys.meta_path.insert(0, _FINDER)
        if os.environ.get("GPUDASH_RUN_ROOT") == str(os.getpid()):
            atexit.register(_job_done)  # first registered: runs after the agent's and the Monitor's
    # step aside: off sys.path, out of sys.modules, and run the sitecustomize we shadowed
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    me = sys.modules.get(__name__)
    if __name__ != "sitecustomize" or me is None:
        return
    del sys.modules["sitecustomize"]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        # the import system reads this entry back once we return: the shadowed module, or us
        sys.modules.setdefault("sitecustomize", me)


_boot()
