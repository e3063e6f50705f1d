"""A full fine-tune that ran out of memory is told which LoRA / QLoRA mixes fit, with predicted peaks."""

from __future__ import annotations

import re
from typing import Any

from gpudash.analysis import summarize
from gpudash.analysis.recommend import adapter_mixes
from gpudash.units import human_bytes


def test_oom_of_a_full_finetune_lists_adapter_mixes_that_fit(recorded: Any) -> None:
    run = recorded("oom-crash")
    v = {x.kind: x for x in summarize(run)}["oom:did not fit"]
    cap = v.numbers["capacity_bytes"]
    mixes = adapter_mixes(run, 0.9 * cap)
    assert mixes and all(m.finetune in ("lora", "qlora") and m.peak_bytes <= 0.9 * cap for m in mixes)
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
