"""``gpudash run [--run-dir DIR] [--serve] [--snapshot-every N] -- COMMAND ARGS...``

Runs COMMAND (``python train.py``, ``python -m pkg.train``, ``torchrun ...``)
unchanged, recorded by gpudash: every Python process it starts loads
gpudash's agent before user code (a ``sitecustomize`` on a private
``PYTHONPATH`` entry), and every torchrun rank records into the same run.

Without ``--serve`` this process *becomes* COMMAND (exec) when COMMAND is
Python (an interpreter, or a script such as ``torchrun``): same pid, same
stdin/stdout/stderr, same exit code and signals; otherwise (a shell wrapper)
it waits for COMMAND, passing signals on. The end cause nothing in the job can
record, the OOM killer's SIGKILL, goes into the run (``end_cause:
oom_killed``, ``zerocode/endwatch.py``): after an exec a small watcher records
it, waiting this process does. Either way the job's last word
(``zerocode/outcome.py``) says why when no process recorded a step, and leaves
a run folder with a ``no_steps`` event. With ``--serve`` the
dashboard runs in its own process beside the job (one for all ranks), its
URL is printed, and this process waits for COMMAND and exits with its code.
gpudash's own messages go to stderr, prefixed ``gpudash:``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from urllib.parse import quote

import gpudash
from gpudash.commands._flags import add_alert_arguments, add_fields, add_server_arguments
from gpudash.commands.train import monitor_from_args
from gpudash.errors import UserError
from gpudash.options import DEFAULT_PORT, MonitorOptions, options_to_json
from gpudash.store.objstore import is_url, run_name
from gpudash.zerocode import endwatch, outcome
from gpudash.zerocode.agent import ENV_OPTIONS, ENV_RUN_DIR, say

__all__ = ["add_arguments", "child_env", "default_run_name", "run"]

BOOT_DIR = Path(gpudash.__file__).resolve().parent / "zerocode" / "_boot"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "gpudash run [--run-dir DIR] [--serve [--port PORT] ...] [recording flags] -- COMMAND [ARGS ...]"
    p.add_argument("--run-dir", default=None,
                   help="where to record: a folder, or an object-store URL such as s3://bucket/runs/exp1 "
                        "(default: runs/<script>-<date>-<time>)")
    p.add_argument("--serve", action="store_true", help="serve the live dashboard beside the job and print its URL")
    add_server_arguments(p.add_argument_group("the dashboard, with --serve"), busy="when busy, a free one")
    add_fields(p.add_argument_group("recording (gpudash.MonitorOptions, for every process of COMMAND)"),
               MonitorOptions, "monitor", skip=("alerts",))
    add_alert_arguments(p.add_argument_group("alerts (gpudash.AlertOptions)"))
    p.add_argument("job", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                   help="the training command, unchanged: python train.py ..., python -m pkg.train, torchrun ...")


def default_run_name(command: list[str], now: float | None = None) -> str:
    """``<script stem>-<date>-<time>``: the first ``*.py`` argument, else the module after
    ``-m``, else the program's name."""
    stem = None
    for i, arg in enumerate(command):
        if arg.endswith(".py"):
            stem = Path(arg).stem
            break
        if arg == "-m" and i + 1 < len(command):
            stem = command[i + 1].rsplit(".", 1)[-1]
            break
    stem = stem or Path(command[0]).name or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def _in_site_packages(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def child_env(base: dict[str, str], run_dir: Path | str, options: MonitorOptions) -> dict[str, str]:
    """The environment COMMAND runs in: the boot folder first on PYTHONPATH (the user's
    entries kept after it), gpudash's source tree last when it is not installed, and
    where and how to record."""
    env = dict(base)
    parts = [str(BOOT_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    source = Path(gpudash.__file__).resolve().parents[1]
    if not _in_site_packages(source) and str(source) not in parts:
        parts.append(str(source))  # a source checkout: the child imports this gpudash too
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_OPTIONS] = options_to_json(options)  # read back by gpudash.zerocode.agent (options_from_json)
    return env


def _free_port(host: str, preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise UserError(f"no free port for the dashboard on {host}; pass --port")


def _announce_when_up(host: str, port: int, url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with socket.create_connection((probe, port), timeout=1):
                say(f"dashboard at {url}")
                return
        except OSError:
            time.sleep(0.2)
    say(f"the dashboard did not start; run `gpudash serve {url}` yourself" if server.poll() is None else
        "the dashboard did not start (is gpudash installed with its dashboard?)")


def _serve_and_wait(command: list[str], env: dict[str, str], run_dir: Path | str, args: argparse.Namespace) -> int:
    from gpudash.server.access import TOKEN_ENV, check_bind, resolve_token, token_from_env

    token = resolve_token(args.token)
    check_bind(args.host, token)  # before the job starts: exposing the runs needs a token
    asked, port = args.port, _free_port(args.host, args.port)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    if port != asked and asked:
        say(f"port {asked} is busy; dashboard on http://{shown}:{port}/")
    server_env = dict(os.environ)
    if token is not None:
        server_env[TOKEN_ENV] = token  # to the server by its environment: a token in argv shows in `ps`
    parent = str(run_dir).rstrip("/").rsplit("/", 1)[0] if is_url(run_dir) else str(Path(run_dir).parent)
    argv = [sys.executable, "-m", "gpudash", "serve", parent, "--host", args.host, "--port", str(port)]
    for name in args.allow_host:
        argv += ["--allow-host", name]
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=server_env)
    url = f"http://{shown}:{port}/run/{quote(run_name(run_dir))}"
    if token is not None:  # a token kept in the environment is never printed
        url += f"?token=${TOKEN_ENV}" if token_from_env(args.token) else f"?token={quote(token)}"
    threading.Thread(target=_announce_when_up, args=(args.host, port, url, server), daemon=True).start()
    base = endwatch.baseline(os.getpid())
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        server.terminate()
        raise UserError(f"cannot start {command[0]}: {exc.strerror or exc}") from exc
    try:
        rc = _wait(child, run_dir, env, command[0], base)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    return _exit_as(rc)


def _wait(child: subprocess.Popen[bytes], run_dir: Path | str, env: dict[str, str], name: str,
          base: endwatch.Baseline) -> int:
    """Wait for the job (signals passed on) and give its last word (outcome.job_done); its exit status. Killed by
    SIGKILL: the OOM killer's kill recorded as the run's end cause where the evidence says so (endwatch.settle,
    with the OOM-kill counters ``base`` read before the job started)."""
    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    # Ctrl-C reaches the job from the terminal itself; SIGTERM/SIGHUP sent to us are passed on
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if rc == -signal.SIGKILL and not is_url(run_dir):
        # the job was killed before its processes could say so at their exit: their state files would read
        # "nothing trained"; the run folder says what happened (its open ranks closed, or, killed before it
        # opened one, a record of that)
        said = ("killed by the kernel's OOM killer (SIGKILL; the OOM-kill counter went up or memory was nearly "
                "full)") if endwatch.settle(run_dir, base) else endwatch.record_killed_before_a_step(run_dir, base)
        if said:
            said += ": recorded as the run's end cause"
            if env.get(outcome.ENV_STATE):
                shutil.rmtree(env[outcome.ENV_STATE], ignore_errors=True)
            say(f"{name} was {said}")
            return rc
    outcome.job_done(str(run_dir), env.get(outcome.ENV_STATE), exit_code=rc)
    if rc == -signal.SIGKILL:  # no traceback, nothing recorded by the job itself: say what usually sends it
        say(f"{name} was killed by SIGKILL: the kernel's OOM killer, when the machine's memory ran out "
            "(`dmesg | grep -i oom` says); the run's summary names it when its last host sample saw memory full")
    return rc


def _exit_as(rc: int) -> int:
    if rc < 0:  # killed by a signal: die the same way
        if -rc not in (signal.SIGKILL, signal.SIGSTOP):  # those two keep their default action (no handler)
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


def _is_python(program: str) -> bool:
    """Whether ``program`` is a Python interpreter or a Python script (a console script's shebang)."""
    if Path(program).name.startswith("python"):
        return True
    try:
        with open(program, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def run(args: argparse.Namespace) -> int:
    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("give the command to run after --, e.g. gpudash run -- python train.py")
    server_flags = [flag for flag, given in (("--host", args.host != "127.0.0.1"), ("--port", args.port != DEFAULT_PORT),
                                             ("--token", args.token is not None), ("--allow-host", args.allow_host))
                    if given]
    if server_flags and not args.serve:
        raise UserError(f"{', '.join(server_flags)} set(s) the dashboard served beside the job: add --serve, "
                        "or leave them out")
    run_dir: Path | str = args.run_dir if args.run_dir and is_url(args.run_dir) else \
        Path(args.run_dir or Path("runs") / default_run_name(command)).resolve()
    options = monitor_from_args(args)
    env = child_env(dict(os.environ), run_dir, options)
    program = shutil.which(command[0], path=env.get("PATH"))
    if program is None:
        raise UserError(f"{command[0]}: command not found")
    say(f"recording into {run_dir}")
    env[outcome.ENV_STATE] = tempfile.mkdtemp(prefix="gpudash-run-")  # each process's state, for the last word
    if args.serve:
        return _serve_and_wait([program, *command[1:]], env, run_dir, args)
    if not _is_python(program):  # a shell, a wrapper: wait for it and give the job's last word here
        base = endwatch.baseline(os.getpid())
        try:
            child = subprocess.Popen([program, *command[1:]], env=env)
        except OSError as exc:
            raise UserError(f"cannot start {command[0]}: {exc.strerror or exc}") from exc
        return _exit_as(_wait(child, run_dir, env, command[0], base))
    env[outcome.ENV_ROOT] = str(os.getpid())  # the process this one becomes gives the last word at its exit
    if not is_url(run_dir):  # a kill nothing in the job can record (the OOM killer's SIGKILL): the watcher's
        endwatch.spawn(run_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, command, env)
    except OSError as exc:
        raise UserError(f"cannot start {command[0]}: {exc.strerror or exc}") from exc
    return 0  # not reached: exec replaced this process
