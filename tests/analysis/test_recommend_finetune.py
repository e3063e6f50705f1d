"""A full fine-tune that ran out of memory is told which LoRA / QLoRA mixes fit, with predicted peaks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpudash.analysis import summarize
from gpudash.analysis.recommend import adapter_mixes, run_setup
from gpudash.memmodel.plan import CARD_SHARE
from gpudash.units import human_bytes


def test_oom_of_a_full_finetune_lists_adapter_mixes_that_fit(recorded: Any) -> None:
    run = recorded("oom-crash")
    v = {x.kind: x for x in summarize(run)}["oom:did not fit"]
    cap = v.numbers["capacity_bytes"]
    mixes = adapter_mixes(run, cap)
    assert mixes and all(m.finetune in ("lora", "qlora") and m.peak_bytes <= CARD_SHARE * cap for m in mixes)
    text = v.recommendation or ""
    assert "--finetune lora|qlora" in text
    peaks = re.findall(r"predicted peak ([^;)]+)", text.split("adapters instead", 1)[1])
    assert peaks and peaks[0].strip() == human_bytes(mixes[0].peak_bytes)
    assert v.numbers["adapter_peak_bytes"] == mixes[0].peak_bytes < cap


def test_no_adapter_advice_without_a_shape(recorded: Any) -> None:
    run = recorded("oom-crash")
    run.meta.pop("trainer", None)
    run.meta.pop("config", None)
    assert adapter_mixes(run, 2**30) == []


def test_the_oom_advice_and_gpudash_estimate_agree_on_what_fits(recorded: Any, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """One card share: the adapter mixes the OOM advice offers are the ones `gpudash estimate --card-gb`
    lists for the same model, sequence length and card, at the same micro-batch and peak."""
    from helpers.tiny_hf import TINY

    from gpudash.cli import main

    run = recorded("oom-crash")
    run.meta["config"] = {**(run.meta.get("config") or {}), "hf": TINY["llama"]}  # as a HF Trainer run records it
    v = {x.kind: x for x in summarize(run)}["oom:did not fit"]
    cap, seq, rows = v.numbers["capacity_bytes"], run_setup(run)["seq_len"], run_setup(run)["micro_batch"]
    advice = adapter_mixes(run, cap)
    assert advice and any(m.micro_batch > 1 for m in advice)
    (tmp_path / "config.json").write_text(json.dumps(TINY["llama"]))
    assert main(["estimate", "--config", str(tmp_path / "config.json"), "--seq-len", str(seq), "--batch", str(rows),
                 "--card-gb", str(cap / 2**30), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["what_fits"]
    key = ("finetune", "weights", "optimizer", "ckpt", "micro_batch", "accum", "peak_bytes")
    assert {tuple(getattr(m, k) for k in key) for m in advice} == {
        tuple(r[k] for k in key) for r in listed if r["finetune"] != "full" and r["micro_batch"]}
    assert all(m.peak_bytes <= CARD_SHARE * cap for m in advice)
