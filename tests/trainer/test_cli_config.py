"""``gpudash train``'s flags and TrainConfig's fields stay one set: every flag reaches its
field, every field is a flag or deliberately left off the command line, defaults agree."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpudash.commands.train import (
    _steps_list,
    add_arguments,
    config_from_args,
    nonnegative_float,
    positive_float,
    positive_int,
)
from gpudash.trainer.config import TrainConfig

#: flag dest -> TrainConfig field, where the names differ
RENAMED = {"model": "model_overrides", "inject_nan_at_step": "inject_nan_at_steps",
           "inject_spike_at_step": "inject_spike_at_steps", "monitor": "monitor_options", "no_progress": "progress",
           "alert_webhook": "monitor_options", "alert": "monitor_options"}  # alerts are Monitor options
#: fields with no flag (library-only knobs)
NOT_ON_CLI = {"samples", "warmup_steps", "weight_decay", "spike_factor"}
#: the CLI's default differs from the library's on purpose
CLI_DEFAULTS = {"run_dir", "progress"}
#: a valid non-default value for each string flag: argv, and the field's expected value
STRINGS: dict[str, tuple[list[str], Any]] = {
    "preset": (["--preset", "small"], "small"),
    "ckpt": (["--ckpt", "block"], "block"),
    "precision": (["--precision", "bf16"], "bf16"),
    "offload": (["--offload", "optimizer"], "optimizer"),
    "weights": (["--weights", "bf16", "--offload", "optimizer", "--precision", "bf16"], "bf16"),
    "batch": (["--batch", "4"], 4),
    "name": (["--name", "x"], "x"),
    "device": (["--device", "cpu"], "cpu"),
    "model": (["--model", "n_layer=2"], {"n_layer": 2}),
    "monitor": (["--monitor", "snapshot_every=10"], {"snapshot_every": 10}),
    "alert_webhook": (["--alert-webhook", "http://127.0.0.1:9/hook"], {"alerts": {"webhook": "http://127.0.0.1:9/hook"}}),
    "alert": (["--alert", "cooldown_s=5", "--alert", "kinds=nonfinite,oom"],
              {"alerts": {"cooldown_s": 5.0, "kinds": ["nonfinite", "oom"]}}),
}


def _actions() -> list[argparse.Action]:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return [a for a in p._actions if a.dest != "help"]


def _config(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(argv))
    assert isinstance(cfg, TrainConfig)
    return cfg


def test_every_flag_is_a_field_and_every_field_a_flag() -> None:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    flags = {RENAMED.get(a.dest, a.dest) for a in _actions()}
    assert flags - fields == set(), "flags with no TrainConfig field"
    assert fields - flags == NOT_ON_CLI, "TrainConfig fields with no flag (add one, or list them in NOT_ON_CLI)"


def test_defaults_agree() -> None:
    cli, lib = _config([]), TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name not in CLI_DEFAULTS:
            assert getattr(cli, f.name) == getattr(lib, f.name), f.name


@pytest.mark.parametrize("action", _actions(), ids=lambda a: a.dest)
def test_each_flag_reaches_its_field(action: argparse.Action) -> None:
    field = RENAMED.get(action.dest, action.dest)
    flag = action.option_strings[0]
    if action.dest in STRINGS:
        argv, expected = STRINGS[action.dest]
    elif isinstance(action, argparse._StoreTrueAction):
        argv, expected = [flag], not action.dest.startswith("no_")  # --no-x turns x off
    elif action.type is _steps_list:
        argv, expected = [flag, "3,4"], (3, 4)
    elif action.type is Path:
        argv, expected = [flag, "runs/elsewhere"], Path("runs/elsewhere")
    elif action.type in (int, float, positive_int, positive_float, nonnegative_float):
        expected = (int if action.type in (int, positive_int) else float)(action.default) + 2
        argv = [flag, str(expected)]
    else:
        pytest.fail(f"{flag}: add a sample value to STRINGS")
    value = getattr(_config(argv), field)
    assert value == expected and value != getattr(_config([]), field), f"{flag} does not reach {field}"
