"""``gpudash demo``: the trainer's tiny preset with the live dashboard beside it.

Starts the dashboard on loopback (port 8050, or a free one if that is taken; ``--host``,
``--token`` and ``--allow-host`` as on ``gpudash serve``), prints the run page's URL, trains the tiny GPT (on the GPU when there is one,
else on the CPU; data ships with Python, nothing is downloaded), then keeps
serving the finished run for replay until Ctrl-C (``--exit`` stops at once).
"""

from __future__ import annotations

import argparse
import errno
import time
from pathlib import Path
from urllib.parse import quote

from gpudash.commands._flags import add_server_arguments
from gpudash.errors import UserError
from gpudash.terminal import printable_lines

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are written (default: runs)")
    p.add_argument("--steps", type=int, default=1500,
                   help="training steps (default: 1500, about a minute on a laptop CPU: time to watch it live)")
    p.add_argument("--preset", default="tiny", help="model preset (default: tiny)")
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu or cuda")
    add_server_arguments(p, busy="when busy, a free one, said on the first line")
    p.add_argument("--exit", action="store_true", help="stop when training ends instead of serving the replay")


def _serve(runs_dir: Path, args: argparse.Namespace) -> tuple[str, object]:
    from gpudash.server.access import TOKEN_ENV, resolve_token, token_from_env
    from gpudash.server.app import serve_in_thread

    token = resolve_token(args.token)
    try:
        url, stop = serve_in_thread(runs_dir, args.host, args.port, token, allow_hosts=args.allow_host)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise UserError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}); pick another --port") from None
        url, stop = serve_in_thread(runs_dir, args.host, 0, token, allow_hosts=args.allow_host)
        print(f"gpudash demo: port {args.port} is busy; dashboard on {url.split('?')[0]}", flush=True)
    if token_from_env(args.token):  # a secret kept in the environment is never printed
        url = url.split("?token=")[0] + f"?token=${TOKEN_ENV}"
    return url, stop


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise UserError("--steps must be >= 1")
    try:
        from gpudash.trainer import TrainConfig, train
    except ImportError as exc:
        raise UserError(f"the demo trains a model and needs torch ({exc}); run `make demo`, "
                        "or pip install 'gpudash[train]'") from exc
    from gpudash.commands.info import summarize
    from gpudash.store import load_run

    args.runs_dir.mkdir(parents=True, exist_ok=True)
    name = time.strftime("demo-%Y%m%d-%H%M%S")
    run_dir = args.runs_dir / name
    try:
        cfg = TrainConfig(preset=args.preset, steps=args.steps, run_dir=run_dir, name=name, device=args.device,
                          batch="auto", progress=True)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    url, stop = _serve(args.runs_dir, args)
    base, _, query = url.partition("?")
    page = f"{base.rstrip('/')}/run/{quote(name)}" + (f"?{query}" if query else "")
    print(f"gpudash demo: dashboard at {url}\n              this run:   {page}\n"
          f"              training the {args.preset} GPT for {args.steps} steps -> {run_dir}", flush=True)
    try:
        train(cfg)
        r = load_run(run_dir)
        print(printable_lines(summarize(r)))
        r.close()
        print(f"\nReplay it at {page}; also: gpudash info {run_dir}, "
              f"gpudash report {run_dir}")
        if not args.exit:
            print("Serving until Ctrl-C.", flush=True)
            while True:
                time.sleep(3600)
    finally:
        stop()  # type: ignore[operator]
    return 0
