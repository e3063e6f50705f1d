"""The Hugging Face estimator against what autograd really saves and what a real Trainer run holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.memmodel.finetune import estimate_hf
from gpudash.memmodel.fit import what_fits
from gpudash.memmodel.hf_activations import Setting, saved_bytes
from gpudash.memmodel.hf_arch import HFArch, hf_preset
from gpudash.memmodel.plan import CARD_SHARE

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers.tiny_hf import TINY, build, measure  # noqa: E402


@pytest.mark.parametrize("family", list(TINY))
@pytest.mark.parametrize("mode", ["full", "lora", "ckpt-lora"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_activations_match_what_autograd_saves(family: str, mode: str, attn: str) -> None:
    cfg = TINY[family]
    arch = HFArch.from_dict(cfg)
    lora = arch.resolve_targets(None) if "lora" in mode else None
    if lora is not None:
        pytest.importorskip("peft")
    model = build(cfg, attn, lora)
    if mode.startswith("ckpt"):
        model.gradient_checkpointing_enable()
    measured = measure(model, 4, 32, cfg["vocab_size"])
    s = Setting(trainable="lora" if lora else "full", lora_targets=lora or (), attn=attn, cuda=False,
                ckpt=mode.startswith("ckpt"))
    assert abs(saved_bytes(arch, s, 4, 32).total / measured - 1) < 0.01


@pytest.mark.parametrize("family", list(TINY))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_autocast_activations_match(family: str, attn: str, mode: str) -> None:
    """bf16 autocast over fp32 weights: each matmul's own 16-bit input copy, the weights' 16-bit copies,
    fp32 norms and softmax (GPT-2's CPU sdpa with dropout falls back to the fp32 math kernel)."""
    cfg = TINY[family]
    arch = HFArch.from_dict(cfg)
    lora = arch.resolve_targets(None) if mode == "lora" else None
    if lora is not None:
        pytest.importorskip("peft")
    measured = measure(build(cfg, attn, lora), 2, 32, cfg["vocab_size"], autocast=True)
    s = Setting(trainable=mode, lora_targets=lora or (), compute=2, autocast=True, attn=attn, cuda=False)
    assert abs(saved_bytes(arch, s, 2, 32).total / measured - 1) < 0.01


def test_parameter_counts_are_the_published_ones() -> None:
    for name, n in (("llama-2-7b", 6_738_415_616), ("llama-2-13b", 13_015_864_320), ("mistral-7b", 7_241_732_096),
                    ("gpt2", 124_439_808)):
        arch = hf_preset(name)
        assert arch is not None and arch.n_params() == n
    for family, cfg in TINY.items():
        model = build(cfg)
        assert HFArch.from_dict(cfg).n_params() == sum(p.numel() for p in model.parameters()), family


def test_lora_bytes_match_peft() -> None:
    pytest.importorskip("peft")
    cfg = TINY["llama"]
    model = build(cfg, lora=("q_proj", "v_proj"))
    est = estimate_hf(HFArch.from_dict(cfg), micro_batch=4, seq_len=32, finetune="lora",
                      lora_targets=("q_proj", "v_proj"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert est.trainable_params == sum(p.numel() for p in trainable)
    assert est.params_bytes == sum(p.numel() * p.element_size() for p in model.parameters())


def test_nf4_bytes_follow_bitsandbytes_blocks() -> None:
    arch = hf_preset("llama-2-7b")
    assert arch is not None
    dq = estimate_hf(arch, micro_batch=1, seq_len=8, finetune="qlora", precision="bf16")
    plain = estimate_hf(arch, micro_batch=1, seq_len=8, finetune="qlora", precision="bf16", double_quant=False)
    n_lin = sum(lin.d_in * lin.d_out for lin in arch.linears()) * arch.n_layer
    # QLoRA paper section 2: double quantization saves 0.5 - 0.127 = 0.373 bits per parameter
    assert abs((plain.params_bytes - dq.params_bytes) * 8 / n_lin - 0.373) < 0.002
    with pytest.raises(ValueError, match="nf4"):
        estimate_hf(arch, micro_batch=1, seq_len=8, finetune="qlora", weights="bf16")


def test_what_fits_a_7b_on_small_cards_is_lora_and_qlora() -> None:
    arch = hf_preset("llama-2-7b")
    assert arch is not None
    for gb in (24, 16, 12, 8):
        fits = [f for f in what_fits(arch, card_bytes=gb * 2**30, seq_len=512) if f.micro_batch]
        assert fits and all(f.finetune != "full" for f in fits)
        assert all(f.peak_bytes <= gb * 2**30 * CARD_SHARE for f in fits)
    eight = [f.finetune for f in what_fits(arch, card_bytes=8 * 2**30, seq_len=512) if f.micro_batch]
    assert set(eight) == {"qlora"}


def test_trainer_lora_run_matches_the_estimate(tmp_path: Path) -> None:
    """The issue's bar: HF Trainer, tiny random Llama, LoRA r=8 on q_proj,v_proj, fp32, batch 4 x 32."""
    peft = pytest.importorskip("peft")
    from gpudash import load_run
    from gpudash.integrations.hf import GpudashCallback

    cfg = TINY["llama"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = build(cfg, "sdpa", ("q_proj", "v_proj"))
    assert isinstance(model, peft.PeftModel)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ids = torch.randint(0, cfg["vocab_size"], (32, 32), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    run_dir = tmp_path / "run"
    targs = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
                                           report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                                           dataloader_num_workers=0, optim="adamw_torch")
    transformers.Trainer(model=model, args=targs, train_dataset=Tokens(),
                         callbacks=[GpudashCallback(run_dir, host_hz=0, handle_signals=False)]).train()
    mem = load_run(run_dir).memory
    out = subprocess.run([sys.executable, "-m", "gpudash", "estimate", "--config", str(tmp_path / "config.json"),
                          "--finetune", "lora", "--lora-r", "8", "--lora-targets", "q_proj,v_proj", "--batch", "4",
                          "--seq-len", "32", "--precision", "fp32", "--json"], capture_output=True, text=True, check=True)
    est = json.loads(out.stdout)
    assert abs(est["params_bytes"] / mem["params_bytes"].max() - 1) < 0.01
    assert abs(est["grads_bytes"] / mem["grads_total_bytes"].max() - 1) < 0.01
    assert abs(est["optimizer_bytes"] / mem["optimizer_bytes"].max() - 1) < 0.01
    assert abs(est["activations_bytes"] / mem["activations_bytes"].max() - 1) < 0.10


@pytest.mark.parametrize(("args", "words"), [
    (["--config", "/nonexistent/config.json"], "no such file"),
    (["--config", "BAD_JSON"], "not a readable JSON"),
    (["--config", "BERT"], "model_type 'bert' is not supported"),
    (["--preset", "llama-2-7b", "--finetune", "lora", "--lora-targets", "q_proj,wq"], "wq: no such module"),
    (["--preset", "llama-2-7b", "--finetune", "qlora", "--weights", "bf16"], "use --weights nf4"),
    (["--preset", "llama-2-7b", "--weights", "nf4"], "--finetune qlora"),
    (["--preset", "llama-2-7b", "--optimizer", "lion"], "--optimizer"),
    (["--preset", "llama-2-7b", "--attn", "flash"], "--precision bf16"),
    (["--preset", "llama-2-7b", "--ckpt", "attn"], "checkpoints whole layers"),
    (["--preset", "gpt2", "--seq-len", "2048"], "n_positions"),
    (["--preset", "llama-2-7b", "--model", "n_layer=2"], "--config"),
    (["--preset", "tiny", "--finetune", "lora"], "--config config.json"),
])
def test_bad_finetune_input_gets_one_line(args: list[str], words: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.cli import main

    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    args = [{"BAD_JSON": str(tmp_path / "bad.json"), "BERT": str(tmp_path / "bert.json")}.get(a, a) for a in args]
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gpudash: error: ") and words in err, err


def test_cli_table_and_json_agree_for_a_shipped_preset(capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.cli import main
    from gpudash.units import human_bytes

    argv = ["estimate", "--preset", "llama-2-7b", "--finetune", "qlora", "--ckpt", "block", "--precision", "bf16",
            "--optimizer", "paged_adamw8bit", "--batch", "2", "--seq-len", "512", "--card-gb", "12"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits_card"] and d["what_fits"] and d["trainable_params"] == 4_194_304  # r=8 on q,v: 32 x 2 x 8 x 8192
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert re.search(rf"peak_bytes\s+{re.escape(human_bytes(d['peak_bytes'], 2))}", text)
    assert "qlora" in text and "no weight gradients for frozen matrices" in text.replace("\n    ", " ")


def test_default_lora_targets_are_pefts() -> None:
    pytest.importorskip("peft")
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_defaults

    from gpudash.memmodel.hf_arch import LORA_DEFAULT_TARGETS

    for family, targets in LORA_DEFAULT_TARGETS.items():
        assert set(targets) == set(peft_defaults[family]), family


def test_notes_say_what_lora_and_nf4_change() -> None:
    from gpudash.memmodel.fit import explain

    arch = hf_preset("llama-2-7b")
    assert arch is not None
    est = estimate_hf(arch, micro_batch=1, seq_len=256, finetune="qlora", precision="bf16", ckpt="block")
    notes = " ".join(explain(arch, est))
    assert f"{est.n_params - est.trainable_params:,} frozen parameters" in notes
    assert "4.127 bits per parameter" in notes  # 4 bits + 8/64 + 32/(64*256) bits of constants
    assert "before the first adapter" not in notes  # under checkpointing the layer inputs need gradients
    full = estimate_hf(arch, micro_batch=1, seq_len=256, precision="bf16")
    assert "frozen" not in " ".join(explain(arch, full))


def test_what_fits_uses_the_asked_adapters() -> None:
    arch = hf_preset("llama-2-7b")
    assert arch is not None
    small = [f for f in what_fits(arch, card_bytes=12 * 2**30, seq_len=512) if f.finetune == "qlora"]
    big = [f for f in what_fits(arch, card_bytes=12 * 2**30, seq_len=512, lora_r=64,
                                   lora_targets=("all-linear",)) if f.finetune == "qlora"]
    assert small[0].trainable_params == 4_194_304 and big[0].trainable_params == 159_907_840
    assert all(f.trainable_params == 6_738_415_616 for f in what_fits(arch, card_bytes=12 * 2**30, seq_len=512,
                                                                          lora_r=64) if f.finetune == "full")


@pytest.mark.parametrize("accum", [1, 2])
def test_tied_head_gradient_spike_matches_torchs_memory_profiler(accum: int) -> None:
    # as the GPT family's test: a large vocabulary and a short batch make the tied weight's partial gradients
    # the peak; under accumulation the earlier micro-batch's gradient is a third V x h beside them
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    vocab = 8192
    cfg = dict(TINY["qwen2"], vocab_size=vocab)  # ties its head
    model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        for _ in range(accum):
            ids = torch.randint(0, vocab, (1, 16))
            model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # optimizer state exists from here on
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    measured = max(sum(s) for s in sizes)
    est = estimate_hf(HFArch.from_dict(cfg), micro_batch=1, seq_len=16, accum=accum, cuda=False)
    assert est.peak_moment == "gradients"
    assert abs(est.peak_bytes - measured) / measured < 0.01, (est.peak_bytes, measured)
