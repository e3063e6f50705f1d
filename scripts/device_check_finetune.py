"""GPU check of the QLoRA / 8-bit parts of ``gpudash estimate`` that cannot run on CPU (issue 28).

    python scripts/device_check_finetune.py OUT_DIR

A random-init scaled-down Llama (no download: saved to a temporary folder and
loaded back 4-bit with bitsandbytes NF4 + double quantization, bf16 compute),
prepared with peft's prepare_model_for_kbit_training, LoRA r=16 on q_proj,v_proj,
trained a few steps with paged_adamw_8bit / adamw_torch under gradient
checkpointing. For each mix it writes the estimator's params, optimizer,
activations and peak beside the measured ones (parameter storages, optimizer
state, saved-tensor hooks, ``torch.cuda.max_memory_allocated``) to
OUT_DIR/finetune.json and prints a table. Skips (and says why) without CUDA,
bitsandbytes or peft.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CFG = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
       "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
       "max_position_embeddings": 1024}


def _storage_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and hasattr(t, "untyped_storage"):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def one(optim: str, batch: int, seq: int, tmp: Path) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    from gpudash.memmodel.finetune import estimate_hf
    from gpudash.memmodel.hf_arch import HFArch

    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, device_map={"": 0},
                                                              dtype=torch.bfloat16, attn_implementation="sdpa")
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    params = _storage_bytes(list(model.parameters()))
    states = [p for p in model.parameters() if hasattr(p, "quant_state") and p.quant_state is not None]
    for p in states:  # absmax, nested absmax, codes of the 4-bit weights
        qs = p.quant_state
        params += _storage_bytes([qs.absmax, qs.code, getattr(qs, "offset", None)])
        if getattr(qs, "state2", None) is not None:
            params += _storage_bytes([qs.state2.absmax])
    opt_cls = {"paged_adamw8bit": "PagedAdamW8bit", "adamw8bit": "AdamW8bit"}
    trainable = [p for p in model.parameters() if p.requires_grad]
    if optim in opt_cls:
        import bitsandbytes as bnbmod

        opt = getattr(bnbmod.optim, opt_cls[optim])(trainable, lr=1e-4)
    else:
        opt = torch.optim.AdamW(trainable, lr=1e-4)
    ids = torch.randint(0, CFG["vocab_size"], (batch, seq), device="cuda")
    model.train()
    saved: dict[int, int] = {}
    pids = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(x: Any) -> Any:
        st = x.untyped_storage()
        if st.data_ptr() not in pids:
            saved[st.data_ptr()] = st.nbytes()
        return x

    for step in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if step == 2:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                    loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated()
    opt_bytes = _storage_bytes([v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)])
    est = estimate_hf(HFArch.from_dict(CFG), micro_batch=batch, seq_len=seq, finetune="qlora", lora_r=16,
                      lora_targets=("q_proj", "v_proj"), optimizer=optim, ckpt="block", precision="bf16")
    del model, opt
    torch.cuda.empty_cache()
    return {"optimizer": optim, "batch": batch, "seq": seq,
            "measured": {"params_bytes": params, "optimizer_bytes": opt_bytes, "activations_bytes": sum(saved.values()),
                         "peak_bytes": peak, "allocated_before_step": base},
            "predicted": {k: getattr(est, k) for k in ("params_bytes", "optimizer_bytes", "activations_bytes",
                                                       "peak_bytes")}}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "device-check")
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    try:
        import bitsandbytes  # noqa: F401
        import peft  # noqa: F401
        import torch
        import transformers
    except ImportError as exc:
        result["skipped"] = f"needs bitsandbytes, peft and transformers ({exc})"
    else:
        if not torch.cuda.is_available():
            result["skipped"] = "no CUDA device: bitsandbytes 4-bit runs on GPU only"
        else:
            with tempfile.TemporaryDirectory() as d:
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CFG))
                model.save_pretrained(d)
                del model
                result["runs"] = [one(o, b, 512, Path(d)) for o in ("adamw", "paged_adamw8bit") for b in (1, 4)]
    (out / "finetune.json").write_text(json.dumps(result, indent=1))
    if "skipped" in result:
        print(f"finetune check skipped: {result['skipped']}")
        return 0
    print(f"{'optimizer':<16}{'batch':>6}  {'category':<18}{'predicted':>14}{'measured':>14}{'ratio':>8}")
    for r in result["runs"]:
        for k, v in r["predicted"].items():
            m = r["measured"][k]
            print(f"{r['optimizer']:<16}{r['batch']:>6}  {k:<18}{v:>14,}{m:>14,}{v / max(m, 1):>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
