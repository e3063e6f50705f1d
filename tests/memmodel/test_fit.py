"""One way into the memory model: the same Estimate and FitOption for gpudash's GPT and a Hugging Face
model, and errors that name the parameter (the CLI names its flag)."""

from __future__ import annotations

import pytest

from gpudash.commands.estimate import FLAGS
from gpudash.memmodel.fit import estimate, explain, what_fits
from gpudash.memmodel.hf_arch import hf_preset
from gpudash.memmodel.plan import Estimate, FitOption, ParamError
from gpudash.memmodel.shapes import preset


def test_one_estimate_type_for_both_families() -> None:
    gpt, arch = preset("gpt2-124m"), hf_preset("llama-2-7b")
    assert arch is not None
    a = estimate(gpt, micro_batch=2, seq_len=256, precision="bf16", ckpt="block")
    b = estimate(arch, micro_batch=2, seq_len=256, precision="bf16", ckpt="block", finetune="lora")
    assert type(a) is type(b) is Estimate and a.to_dict().keys() == b.to_dict().keys()
    assert a.finetune == "full" and a.trainable_params == a.n_params == gpt.n_params()
    assert b.finetune == "lora" and 0 < b.trainable_params < b.n_params
    assert explain(gpt, a) and explain(arch, b)
    rows = what_fits(gpt, card_bytes=24 * 2**30, seq_len=256) + what_fits(arch, card_bytes=24 * 2**30, seq_len=256)
    assert all(type(r) is FitOption for r in rows)
    assert {r.finetune for r in rows} == {"full", "lora", "qlora"}


def test_a_switch_the_gpt_does_not_have_is_refused_by_name() -> None:
    with pytest.raises(ParamError) as ei:
        estimate(preset("tiny"), micro_batch=1, seq_len=16, finetune="lora")
    assert str(ei.value).startswith("finetune 'lora' is modelled for Hugging Face architectures")
    assert ei.value.render(FLAGS).startswith("--finetune 'lora'")
    assert estimate(preset("tiny"), micro_batch=1, seq_len=16, finetune="full", lora_r=8).finetune == "full"


def test_errors_name_the_parameter_and_render_as_flags() -> None:
    arch = hf_preset("llama-2-7b")
    assert arch is not None
    with pytest.raises(ParamError) as ei:
        estimate(arch, micro_batch=1, seq_len=8, finetune="qlora", weights="bf16")
    assert "use weights nf4 or int8" in str(ei.value) and "--" not in str(ei.value)
    assert "use --weights nf4 or int8" in ei.value.render(FLAGS)
    with pytest.raises(ParamError) as ei:
        estimate(preset("tiny"), micro_batch=0, seq_len=16)
    assert str(ei.value) == "micro_batch, seq_len and accum must be >= 1"
    assert ei.value.render(FLAGS) == "--batch, --seq-len and --accum must be >= 1"
    with pytest.raises(ParamError) as ei:
        arch.resolve_targets(("q_proj", "{wq}"))  # user text with braces is left as it is
    assert str(ei.value).startswith("lora_targets {wq}: no such module")
