"""The memory model's technique names: a Literal alias each, its tuple of values derived from it, and one check
that a name given at run time is one of them (issue 47: free strings were checked against tuples written in
several places)."""

from __future__ import annotations

from typing import get_args

import pytest

from gpudash.memmodel import names
from gpudash.memmodel.estimator import estimate
from gpudash.memmodel.finetune import estimate_hf
from gpudash.memmodel.hf_arch import hf_preset
from gpudash.memmodel.plan import ParamError
from gpudash.memmodel.shapes import preset


def test_each_tuple_is_its_aliases_values() -> None:
    for alias, values in ((names.Precision, names.PRECISIONS), (names.Offload, names.OFFLOADS),
                          (names.HfOffload, names.HF_OFFLOADS), (names.Finetune, names.FINETUNES),
                          (names.Weights, names.WEIGHTS), (names.GptWeights, names.GPT_WEIGHTS),
                          (names.Optimizer, names.OPTIMIZERS), (names.Attn, names.ATTNS)):
        assert values == get_args(alias)
    assert set(names.GPT_WEIGHTS) <= set(names.WEIGHTS) and set(names.HF_OFFLOADS) <= set(names.OFFLOADS)


def test_one_check_names_the_parameter_and_every_choice() -> None:
    assert names.check("bf16", names.PRECISIONS, "precision") == "bf16"
    with pytest.raises(ParamError) as ei:
        names.check("fp8", names.PRECISIONS, "precision")
    assert ei.value.render({"precision": "--precision"}) == "unknown --precision 'fp8'; use fp32, bf16 or fp16"
    gpt, arch = preset("tiny"), hf_preset("llama-2-7b")
    assert arch is not None
    for call, param in ((lambda: estimate(gpt, micro_batch=1, seq_len=8, precision="fp8"), "precision"),
                        (lambda: estimate(gpt, micro_batch=1, seq_len=8, offload="disk"), "offload"),
                        (lambda: estimate(gpt, micro_batch=1, seq_len=8, weights="nf4"), "weights"),
                        (lambda: estimate(gpt, micro_batch=1, seq_len=8, ckpt="every-0"), "ckpt"),
                        (lambda: estimate_hf(arch, micro_batch=1, seq_len=8, optimizer="lion"), "optimizer"),
                        (lambda: estimate_hf(arch, micro_batch=1, seq_len=8, offload="optimizer+grads"), "offload"),
                        (lambda: estimate_hf(arch, micro_batch=1, seq_len=8, attn="xformers"), "attn")):
        with pytest.raises(ParamError) as ei:
            call()
        assert ei.value.names == (param,)


def test_the_trainer_and_the_estimator_read_a_checkpointing_mode_alike() -> None:
    pytest.importorskip("torch")
    from gpudash.trainer.checkpointing import parse_mode

    for text in ("none", "block", "attn", "mlp", "every-1", "every-3", " Every-2 "):
        plan = parse_mode(text)
        assert (plan.mode, plan.every) == names.parse_ckpt(text)
    with pytest.raises(ValueError, match="unknown checkpointing mode 'every-0'; use none, block, every-N"):
        parse_mode("every-0")
