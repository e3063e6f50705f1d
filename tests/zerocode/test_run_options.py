"""``gpudash run``'s recording options reach the child as MonitorOptions by one pair of functions; a bad or
hand-edited value in the environment is one ``gpudash:`` line and the defaults, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.cli import build_parser
from gpudash.commands.run import child_env
from gpudash.commands.train import monitor_from_args
from gpudash.options import AlertOptions, MonitorOptions, options_from_json, options_to_json

ROOT = Path(__file__).resolve().parents[2]


def test_options_round_trip_through_the_environment(tmp_path: Path) -> None:
    opts = MonitorOptions(snapshot_every=5, host_hz=0.0, allocator=False,
                          alerts=AlertOptions(cooldown_s=5, kinds=("oom", "crashed")))
    env = child_env({}, tmp_path, opts)
    assert options_from_json(env["GPUDASH_RUN_OPTIONS"]) == (opts, None)
    assert options_from_json(options_to_json(MonitorOptions())) == (MonitorOptions(), None)
    assert options_to_json(MonitorOptions()) == "{}"  # only what differs from the defaults travels
    on = MonitorOptions(alerts=True)
    assert options_from_json(options_to_json(on))[0].alerts == AlertOptions()  # alerts on with defaults stays on


@pytest.mark.parametrize(("text", "said"), [
    ("{not json", "not a JSON object"),
    ('["host_hz"]', "not a JSON object"),
    ('{"host_hz": "fast", "snapshot_every": 4}', "recording option host_hz"),
    ('{"memory_every": 0, "snapshot_every": 4}', "memory_every must be >= 1"),
    ('{"bogus": 1, "snapshot_every": 4}', "unknown key(s) 'bogus'"),
    ('{"alerts": {"cooldown_s": -1}, "snapshot_every": 4}', "cooldown_s must be >= 0"),
])
def test_a_bad_value_in_the_environment_is_one_line_and_the_default(text: str, said: str) -> None:
    opts, problem = options_from_json(text)
    assert problem is not None and said in problem and "\n" not in problem
    if "snapshot_every" in text:  # what was good is kept, the bad value gets its default
        assert opts == MonitorOptions(snapshot_every=4)
    else:
        assert opts == MonitorOptions()


def test_run_flags_are_the_monitor_options() -> None:
    args = build_parser("run").parse_args(["run", "--snapshot-every", "3", "--host-hz", "0", "--no-cuda-timing",
                                           "--alert-webhook", "http://127.0.0.1:9/x", "--", "python", "t.py"])
    assert monitor_from_args(args) == MonitorOptions(snapshot_every=3, host_hz=0.0, cuda_timing=False,
                                                     alerts=AlertOptions(webhook="http://127.0.0.1:9/x"))
    assert args.job[-2:] == ["python", "t.py"]


def test_a_hand_edited_environment_never_breaks_the_script(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = ("import torch\nm = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
              "for _ in range(3):\n    m(torch.randn(4, 2)).sum().backward(); opt.step(); opt.zero_grad()\n"
              "print('script done')\n")
    env = child_env({**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, tmp_path / "run",
                    MonitorOptions(host_hz=0.0))
    env["PYTHONPATH"] += os.pathsep + str(ROOT)
    env["GPUDASH_RUN_OPTIONS"] = '{"host_hz": "zero", "handle_signals": false'  # hand-edited, broken
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout == "script done\n", out.stderr
    said = [line for line in out.stderr.splitlines() if line.startswith("gpudash:")]
    assert len(said) == 1 and "not a JSON object" in said[0] and "Traceback" not in out.stderr, out.stderr
    from gpudash import load_run

    run = load_run(tmp_path / "run")
    assert len(run.steps) == 3  # recorded, with the defaults
    run.close()


def test_server_flags_need_serve(capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.cli import main

    assert main(["run", "--host", "0.0.0.0", "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--host" in err[0] and "--serve" in err[0]
