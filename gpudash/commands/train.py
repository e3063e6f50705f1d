"""``gpudash train``: the memory-optimized trainer from the command line.

    gpudash train --preset tiny --steps 50 --ckpt block --precision bf16 --run-dir runs/tiny-block

Every flag is a field of ``TrainConfig`` or ``MonitorOptions`` (made from the fields: name, type,
default and help), plus the alert flags. Testing aids (documented, off by default):
``--memory-budget-gb`` and ``--inject-oom-at-batch`` make OOMs happen on a CPU,
``--inject-nan-at-steps`` makes the loss non-finite, ``--slow-data-ms`` makes the run input-bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from gpudash.commands._flags import (
    add_alert_arguments,
    add_fields,
    alerts_from_args,
    fields_from_args,
    flags_error,
    nonnegative_float,
    positive_float,
    positive_int,
)
from gpudash.errors import UserError
from gpudash.terminal import printable_lines

__all__ = ["add_arguments", "config_from_args", "nonnegative_float", "positive_float", "positive_int", "run",
           "summary_lines"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field and per MonitorOptions field, made from the fields (see _flags)."""
    from gpudash.options import MonitorOptions
    from gpudash.trainer.config import TrainConfig

    add_fields(p.add_argument_group("training (gpudash.trainer.TrainConfig)"), TrainConfig, "train",
               skip=("monitor",))
    add_fields(p.add_argument_group("recording (gpudash.MonitorOptions)"), MonitorOptions, "monitor",
               skip=("alerts",))
    add_alert_arguments(p.add_argument_group("alerts (gpudash.AlertOptions)"))
    # the documented form until the options became flags of their own: still read, with a line that
    # names the new flag, so scripts that pass it keep working while they move
    p.add_argument("--monitor", action="append", default=[], dest="old_monitor", metavar="KEY=VALUE",
                   help=argparse.SUPPRESS)


def old_monitor_items(args: argparse.Namespace) -> None:
    """Move each deprecated ``--monitor KEY=VALUE`` into the namespace as its own flag would (a flag given
    as itself wins); one deprecation line per item, naming the new flag. UserError for a key that is no
    MonitorOptions field or a value its type cannot read."""
    from gpudash.commands._flags import flag_of
    from gpudash.options import MonitorOptions, field_types, from_text

    fields = {f.name: f for f in dataclasses.fields(MonitorOptions) if f.name != "alerts"}
    types = field_types(MonitorOptions)
    given = vars(args)
    for item in getattr(args, "old_monitor", None) or []:
        key, sep, text = item.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or name not in fields:
            flags = ", ".join(flag_of(f) for f in fields.values())
            raise UserError(f"--monitor {item!r}: no Monitor option {name!r}; each Monitor option is a flag of "
                            f"its own now ({flags}; gpudash train --help)")
        flag = flag_of(fields[name])
        try:
            value = from_text(types[name], text.strip())
        except ValueError as exc:
            raise UserError(f"--monitor {item!r}: {exc} (now {flag})") from None
        given.setdefault(f"monitor.{name}", value)
        new = (flag if value else "--no-" + flag[2:]) if types[name] is bool else f"{flag} {text.strip()}"
        print(f"gpudash: --monitor {item} is deprecated and will be removed; use {new}", file=sys.stderr)


def monitor_from_args(args: argparse.Namespace) -> Any:
    """The MonitorOptions the recording and alert flags ask for (``gpudash train`` and ``gpudash run``)."""
    from gpudash.options import MonitorOptions

    try:
        given = fields_from_args(args, MonitorOptions, "monitor")
        given.pop("alerts", None)  # the --alert items, with --alert-webhook: alerts_from_args
        alerts = alerts_from_args(args)
        if alerts is not None:
            given["alerts"] = alerts
        return MonitorOptions(**given)
    except ValueError as exc:
        raise flags_error(exc, MonitorOptions) from None


def config_from_args(args: argparse.Namespace) -> Any:
    from gpudash.trainer.config import TrainConfig

    old_monitor_items(args)
    monitor = monitor_from_args(args)
    try:
        return TrainConfig(**fields_from_args(args, TrainConfig, "train"), monitor=monitor)
    except ValueError as exc:
        raise flags_error(exc, TrainConfig) from None


def summary_lines(run_dir: Path) -> list[str]:
    """What a user wants after a run: the run's facts (as ``gpudash info`` states them), the speed the
    trainer measured, the estimator's prediction per category, and the notable events."""
    from gpudash.analysis.facts import headline_rows, run_facts
    from gpudash.store import load_run
    from gpudash.units import human_bytes

    r = load_run(run_dir)
    try:
        facts = run_facts(r)
        lines = [f"run      {run_dir}  ({r.status})"]
        summ = r.meta.get("train_summary") or {}
        if summ.get("seconds"):
            lines.append(f"trainer  final micro-batch {summ.get('final_micro_batch')}, precision "
                         f"{summ.get('final_precision')}")
        lines += [f"  {label:<13} {text}" for label, text in headline_rows(facts, r.meta)
                  if label not in ("status", "device", "ranks")]
        if len(r.steps) and "loss" in r.steps and r.steps["loss"].notna().any():
            loss = r.steps["loss"].dropna()
            lines.append(f"  {'loss':<13} {loss.iloc[0]:.3f} -> {loss.iloc[-1]:.3f}")
        est = r.meta.get("estimate") or {}
        pred = [f"{k} {human_bytes(est[f'{k}_bytes'])}" for k in facts.peak_bytes
                if k != "measured" and est.get(f"{k}_bytes") is not None]
        if est.get("peak_bytes"):
            pred.append(f"peak {human_bytes(est['peak_bytes'])}")
        if pred:
            lines.append(f"  {'predicted':<13} " + ", ".join(pred))
        if len(r.events):
            for _, ev in r.events.iterrows():
                if ev["kind"] in ("oom", "precision_fallback", "batch_size_change", "loss_spike", "nan",
                                  "config_warning"):
                    step = "" if ev["step"] != ev["step"] else f"step {int(ev['step']):>4}  "
                    lines.append(f"  {step}{ev['kind']}: {ev['message']}")
        lines.append(f"look at it: gpudash serve {run_dir.parent}   |   gpudash info {run_dir}")
        return lines
    finally:
        r.close()


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    from gpudash.trainer.loop import Trainer
    from gpudash.units import human_bytes

    try:
        trainer = Trainer(cfg)
        trainer.build()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if trainer.rank == 0:
        est = trainer.estimate
        print(f"gpudash train: {cfg.preset} ({trainer.model_cfg.n_params() / 1e6:,.1f} M parameters) on "
              f"{trainer.device}, ckpt {cfg.ckpt}, {cfg.precision}, offload {cfg.offload}, micro-batch "
              f"{trainer.batch.micro} of {cfg.effective}; predicted peak {human_bytes(est.peak_bytes)} -> {cfg.run_dir}",
              flush=True)
    try:
        run_dir = trainer.run()
    except MemoryError as exc:  # out of memory even at micro-batch 1: the config cannot run here
        raise UserError(str(exc)) from None
    if trainer.rank == 0:
        print(printable_lines(summary_lines(run_dir)))
    return 0
