"""``gpudash train``'s flags are TrainConfig's and MonitorOptions' fields: every field is a flag (found by
parsing real argv, never argparse's internals), each flag reaches its field, leaving a flag out gives the
field's own default, --help says every flag with its field's doc, and a bad value is one line naming the flag."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from gpudash.cli import build_parser, main
from gpudash.commands._flags import field_docs
from gpudash.commands.train import config_from_args
from gpudash.options import AlertOptions, MonitorOptions
from gpudash.trainer.config import TrainConfig

#: field -> flag, where the flag is not --field-name
RENAMED = {"model_overrides": "--model", "alerts": "--alert"}
#: the command line's default differs from the library's on purpose
CLI_DEFAULTS = {"run_dir", "progress"}
#: a valid non-default value for fields whose type alone gives none: argv after the flag, and the value
SAMPLES: dict[str, tuple[list[str], Any]] = {
    "preset": (["small"], "small"),
    "model_overrides": (["n_layer=2", "--model", "n_head=2"], {"n_layer": 2, "n_head": 2}),
    "run_dir": (["runs/elsewhere"], Path("runs/elsewhere")),
    "name": (["x"], "x"),
    "device": (["cpu"], "cpu"),
    "ckpt": (["block"], "block"),
    "precision": (["bf16"], "bf16"),
    "offload": (["optimizer"], "optimizer"),
    "weights": (["bf16", "--offload", "optimizer", "--precision", "bf16"], "bf16"),
    "batch": (["4"], 4),
    "inject_nan_at_steps": (["3,4"], (3, 4)),
    "inject_spike_at_steps": (["5"], (5,)),
    "eval_splits": (["train,val"], ("train", "val")),
    "alerts": (["cooldown_s=5", "--alert", "desktop=off"], AlertOptions(cooldown_s=5.0, desktop=False)),
}


def _fields() -> list[tuple[type, dataclasses.Field[Any]]]:
    return [(cls, f) for cls in (TrainConfig, MonitorOptions) for f in dataclasses.fields(cls)
            if (cls, f.name) != (TrainConfig, "monitor")]


def _parse(argv: list[str]) -> TrainConfig:
    cfg = config_from_args(build_parser("train").parse_args(["train", *argv]))
    assert isinstance(cfg, TrainConfig)
    return cfg


def _value(cfg: TrainConfig, cls: type, name: str) -> Any:
    return getattr(cfg.monitor if cls is MonitorOptions else cfg, name)


def _sample(cls: type, f: dataclasses.Field[Any]) -> tuple[list[str], Any]:
    flag = RENAMED.get(f.name, "--" + f.name.replace("_", "-"))
    if f.name in SAMPLES:
        rest, expected = SAMPLES[f.name]
        return [flag, *rest], expected
    tp = typing.get_type_hints(cls)[f.name]
    if tp is bool:  # --x / --no-x, away from the command line's default
        default = _value(_parse([]), cls, f.name)
        return [("--no-" if default else "--") + f.name.replace("_", "-")], not default
    if tp in (int, float):
        expected = tp(f.default) + 2
        return [flag, str(expected)], expected
    raise AssertionError(f"{cls.__name__}.{f.name}: add a sample value to SAMPLES")


@pytest.mark.parametrize(("cls", "field"), _fields(), ids=lambda x: getattr(x, "name", None) or x.__name__)
def test_each_field_is_a_flag_that_reaches_it(cls: type, field: dataclasses.Field[Any]) -> None:
    argv, expected = _sample(cls, field)
    value = _value(_parse(argv), cls, field.name)
    assert value == expected and value != _value(_parse([]), cls, field.name), f"{argv} does not reach {field.name}"


def test_alert_flags_reach_the_monitors_alert_options() -> None:
    cfg = _parse(["--alert-webhook", "http://127.0.0.1:9/hook", "--alert", "cooldown_s=5",
                  "--alert", "kinds=nonfinite,oom", "--alert", "desktop=off"])
    assert cfg.monitor.alerts == AlertOptions(webhook="http://127.0.0.1:9/hook", cooldown_s=5.0,
                                              kinds=("nonfinite", "oom"), desktop=False)
    assert _parse([]).monitor.alerts is None


def test_leaving_every_flag_out_gives_the_dataclasses_defaults() -> None:
    cli, lib = _parse([]), TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name not in CLI_DEFAULTS:
            assert getattr(cli, f.name) == getattr(lib, f.name), f.name
    assert cli.progress is True and str(cli.run_dir).startswith("runs/train-")


def test_old_flag_names_still_read() -> None:
    assert _parse(["--inject-nan-at-step", "2,3"]).inject_nan_at_steps == (2, 3)
    assert _parse(["--no-progress"]).progress is False


def test_the_old_monitor_key_value_form_reads_with_a_line_naming_the_new_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _parse(["--monitor", "activations_every=3", "--monitor", "cuda_timing=off", "--monitor", "snapshot_every=2",
                  "--snapshot-every", "5"])
    assert cfg.monitor.activations_every == 3 and cfg.monitor.cuda_timing is False
    assert cfg.monitor.snapshot_every == 5  # the new flag, given as itself, wins
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpudash: --monitor activations_every=3 is deprecated and will be removed; use --activations-every 3",
                   "gpudash: --monitor cuda_timing=off is deprecated and will be removed; use --no-cuda-timing",
                   "gpudash: --monitor snapshot_every=2 is deprecated and will be removed; use --snapshot-every 2"]


@pytest.mark.parametrize(("item", "said"), [
    ("snapshots=2", "--monitor 'snapshots=2': no Monitor option 'snapshots'; each Monitor option is a flag of its own"),
    ("memory_every=x", "--monitor 'memory_every=x': expected a whole number, got 'x' (now --memory-every)"),
    ("memory_every=0", "--memory-every must be >= 1"),
])
def test_a_bad_old_monitor_item_is_one_line(item: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--monitor", item]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpudash: error: ") and said in err[-1], err


def test_help_says_every_flag_with_its_fields_doc(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for cls, f in _fields():
        doc = field_docs(cls)[f.name]
        assert doc, f"{cls.__name__}.{f.name} has no docstring (it is the flag's --help line)"
        assert RENAMED.get(f.name, "--" + f.name.replace("_", "-")) in text
        words = doc.rstrip(".").split()[:4]  # the doc's start, its field names said as flags
        names = {g.name for g in dataclasses.fields(cls) if "_" in g.name}  # as the help says them
        assert " ".join(("--" + w.replace("_", "-")) if w in names else w for w in words) in text, f.name
    assert "(default: 50)" in text and "{fp32,bf16,fp16}" in text and "--alert-webhook" in text


@pytest.mark.parametrize(("argv", "said"), [
    (["--memory-every", "0"], "--memory-every must be >= 1"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--steps", "many"], "argument --steps: expected a whole number, got 'many'"),
    (["--host-hz", "nan"], "argument --host-hz: expected a number"),
    (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    (["--batch", "lots"], "--batch must be 'auto' or a positive integer"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--model", "depth=2"], "--model 'depth=2': expected FIELD=VALUE"),
    (["--model", "tie_embeddings=maybe"], "--model 'tie_embeddings=maybe': expected on or off, got 'maybe'"),
    (["--model", "n_layer=x"], "--model 'n_layer=x': expected a whole number, got 'x'"),
    (["--alert", "cooldown_s=soon"], "--alert 'cooldown_s=soon': expected a number"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--weights", "bf16"], "--weights bf16 needs --offload"),
])
def test_a_bad_value_is_one_line_naming_the_flag(argv: list[str], said: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpudash: error: ") and said in err[0], err


def test_a_recorded_config_reads_back_old_monitor_options_included() -> None:
    cfg = TrainConfig(steps=7, monitor=MonitorOptions(host_hz=0.0, alerts={"cooldown_s": 5}))
    again, notes = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg and notes == []
    old = {**{k: v for k, v in cfg.to_dict().items() if k != "monitor"},
           "monitor_options": {"host_hz": 0, "snapshot_every": 3, "retired_knob": 1}}
    again, notes = TrainConfig.from_dict(old)
    assert again.monitor == MonitorOptions(host_hz=0.0, snapshot_every=3)
    assert len(notes) == 1 and "retired_knob" in notes[0] and "left out" in notes[0]
    with pytest.raises(ValueError, match="config steps"):
        TrainConfig.from_dict({"steps": "ten"})
