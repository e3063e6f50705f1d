"""The memory model: bytes by category, peak and step time for a model, a technique mix and a card.

Plain arithmetic, no torch: the trainer sizes its batches with it, ``gpudash estimate`` prints it, and
analysis turns a run's OOM into advice with it, in a process that has no torch at all (the dashboard).

    fit.py             the one way in, for either model: estimate, what_fits, explain
    plan.py            CARD_SHARE (the share of a card a plan may use), the one Estimate and FitOption, ParamError;
                       fits() and largest_fit(): the one rule of what fits, judged at the accumulation a plan needs
    names.py           the technique names as Literal aliases, and the one check of a name given at run time
    shapes.py          GPTConfig and the presets (tiny ... llama-7b shaped)
    estimator.py       gpudash's GPT: bytes by category and peak per technique mix; its mixes that fit a card
    steptime.py        the step-time model behind "what fits": recompute FLOPs, PCIe transfer, dequantization
    hf_arch.py         Hugging Face config.json -> architecture, PEFT targets; shipped configs in configs/
    hf_activations.py  what autograd saves in an HF decoder, op by op
    finetune.py        a Hugging Face model: full / LoRA / QLoRA memory (nf4, int8, 8-bit AdamW, Adafactor); its mixes that fit
"""
