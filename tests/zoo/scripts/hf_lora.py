"""HF Trainer + PEFT LoRA on a tiny random-init Llama built from a LlamaConfig (nothing downloaded), the way
the PEFT quickstart writes it; evaluates during and after training. Prints what the Trainer logs (its
log_history) as JSON lines, and PEFT's trainable-parameter line.

    python hf_lora.py OUTPUT_DIR [--callback RUN_DIR]
"""

import json
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

out_dir = sys.argv[1]
callbacks = []
if "--callback" in sys.argv:
    from gpudash.integrations.hf import GpudashCallback

    callbacks.append(GpudashCallback(sys.argv[sys.argv.index("--callback") + 1], host_hz=0))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab, seed):
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                         lora_dropout=0.0, task_type="CAUSAL_LM"))
model.print_trainable_parameters()
args = TrainingArguments(output_dir=out_dir, max_steps=6, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         learning_rate=5e-3, lr_scheduler_type="linear", logging_steps=1, eval_strategy="steps",
                         eval_steps=3, per_device_eval_batch_size=4, save_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 16, 128, 1), eval_dataset=Tokens(8, 16, 128, 2),
                  callbacks=callbacks)
trainer.train()
final = trainer.evaluate()
for entry in trainer.state.log_history:
    print("LOG " + json.dumps(entry))
