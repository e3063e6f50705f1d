from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.cli import main


def _gpudash(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUDASH_DEBUG"}
    return subprocess.run([sys.executable, "-m", "gpudash", *args], capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("args", [
    ["train", "--precision", "fp8"],
    ["train", "--batch", "lots"],
    ["train", "--weights", "bf16", "--precision", "bf16"],
    ["train", "--precision", "fp16", "--offload", "optimizer"],
    ["train", "--preset", "gpt5"],
    ["train", "--device", "cuda", "--steps", "1"] if not __import__("torch").cuda.is_available() else ["train", "--steps", "0"],
    ["train", "--seq-len", "4096"],
    ["train", "--device", "cpu", "--memory-budget-gb", "0.001"],  # weights + optimizer alone exceed it
    ["estimate", "--offload", "disk"],
])
def test_bad_flags_and_impossible_configs_get_one_line(args: list[str]) -> None:
    out = _gpudash(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("gpudash: error: ") and "Traceback" not in out.stderr


def test_unknown_flag_ends_in_one_error_line_without_traceback() -> None:
    out = _gpudash("train", "--bogus")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudash: error: unrecognized arguments: --bogus")
    assert "Traceback" not in out.stderr


def test_estimate_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--preset", "gpt2-124m", "--batch", "4", "--seq-len", "512", "--ckpt", "block",
                 "--precision", "bf16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"):
        assert isinstance(data[key], int) and data[key] > 0


def test_estimate_answers_will_it_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--preset", "llama-7b", "--seq-len", "2048", "--card-gb", "24"]) == 0
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "offload optimizer+grads" in out and "ckpt block" in out


def test_train_cli_prints_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--steps", "3", "--batch", "2", "--seq-len", "16", "--device", "cpu", "--ckpt", "block",
               "--inject-oom-at-batch", "2", "--run-dir", str(tmp_path / "r")])
    assert rc == 0
    cap = capsys.readouterr()
    assert "step 3/3" in cap.err  # progress line
    for text in ("peak memory", "activations", "tokens/s", "oom", "batch_size_change"):
        assert text in cap.out, text


def test_monitor_flag_reaches_the_monitor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gpudash

    assert main(["train", "--steps", "3", "--batch", "2", "--seq-len", "16", "--device", "cpu", "--no-progress",
                 "--activations-every", "1", "--host-hz", "0", "--run-dir", str(tmp_path / "m")]) == 0
    r = gpudash.load_run(tmp_path / "m")
    assert r.memory["activations_bytes"].notna().sum() == 2  # every step after the first
    r.close()
    out = _gpudash("train", "--activations-every", "often")
    assert out.returncode == 2 and "--activations-every" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_estimate_takes_any_model_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--preset", "tiny", "--model", "n_layer=8", "--json"]) == 0
    eight = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--preset", "tiny", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert eight["params"] > four["params"] and eight["activations_bytes"] > four["activations_bytes"]


def test_progress_line_has_elapsed_and_eta() -> None:
    from gpudash.trainer.progressline import ProgressLine

    p = ProgressLine(10)
    p.start = 100.0
    for done, end in ((1, 1010.0), (2, 1013.0), (3, 1016.0), (4, 1019.0)):  # a 10 s first step, then 3 s each
        p.update(done, 5.0, 2, 300.0, end=end)
    mid = p.line(4, 5.0, 2, 300.0, now=112.0)  # 6 steps left at the recent 3 s each (the first step not counted)
    assert "step 4/10" in mid and "12.00 s elapsed" in mid and "ETA 18 s" in mid
    end = p.line(10, 4.0, 2, 300.0, now=130.0)
    assert "30.00 s elapsed" in end and "ETA" not in end


@pytest.mark.parametrize(("args", "flag"), [
    (["estimate", "--preset", "llama-7b", "--seq-len", "0"], "--seq-len"),  # not "the preset's 4096"
    (["estimate", "--batch", "0"], "--batch"),
    (["estimate", "--batch", "-4"], "--batch"),
    (["estimate", "--accum", "0"], "--accum"),
    (["estimate", "--card-gb", "0"], "--card-gb"),
    (["estimate", "--card-gb", "nan"], "--card-gb"),
    (["estimate", "--card-gb", "24", "--pcie-gbps", "-1"], "--pcie-gbps"),
    (["estimate", "--card-gb", "24", "--tflops", "0"], "--tflops"),
    (["estimate", "--seq-len", "4096"], "block_size=4096"),  # tiny's block is 64: say how to ask for more
    # train's flags are TrainConfig's fields: 0 means what the field's doc (and --help) says, below 0 is refused
    (["train", "--seq-len", "-1"], "--seq-len"),
    (["train", "--effective-batch", "-2"], "--effective-batch"),
    (["train", "--threads", "-1"], "--threads"),
    (["train", "--lr", "0"], "--lr"),
    (["train", "--memory-cap-gb", "-1"], "--memory-cap-gb"),
    (["train", "--weight-decay", "-0.1"], "--weight-decay"),
    (["train", "--fallback-after", "0"], "--fallback-after"),
    (["train", "--grad-clip", "-1"], "--grad-clip"),
])
def test_nonsense_flags_are_refused_in_one_line(args: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and flag in cap.err, cap.err
    assert cap.err.startswith("gpudash: error: ")


def test_estimate_explains_bf16_activations_and_the_peak(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--preset", "gpt2-124m", "--batch", "1", "--seq-len", "128", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "of which autocast's 16-bit weight copies" in out
    assert "note: bf16 activations" in out and "exceed fp32's" in out
    flat = " ".join(out.split())
    assert "below the sum of the categories" in flat and "do not all peak at the same moment" in flat
    assert main(["estimate", "--preset", "gpt2-124m", "--batch", "1", "--seq-len", "128", "--precision", "bf16",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["weight_copies_bytes"] > 0 and len(data["notes"]) == 2 and data["peak_moment"] == "gradients"


def test_what_fits_shows_host_ram_against_this_machine_and_step_cost(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=64 * 2**30))
    args = ["estimate", "--preset", "llama-7b", "--seq-len", "2048", "--card-gb", "24", "--pcie-gbps", "16"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("  micro-batch")]
    assert rows and all(re.search(r"host 113\.24 GiB!\s+step\s+[\d.]+ s \(\+\d+%\)", r) for r in rows), out
    assert "more than this machine's 64.00 GiB" in out
    flat = " ".join(out.split())
    assert "16 GB/s" in flat and "100 TFLOP/s" in flat and "not overlapped" in flat  # the assumptions, stated
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fits = [f for f in data["what_fits"] if f["micro_batch"]]
    assert data["host_ram_bytes"] == 64 * 2**30 and all(f["fits_host_ram"] is False for f in fits)
    assert data["time_model"]["tokens_per_step"] == 8 * 2048 and all(f["step_cost"] > 0 for f in fits)
