from __future__ import annotations

import pytest
import torch

from gpudash.trainer.model import GPT, PRESETS, GPTConfig, preset


@pytest.mark.parametrize("cfg", [preset("tiny"), preset("tiny", mlp="swiglu", mlp_hidden=96, tie_embeddings=False)])
def test_param_count_formula_matches_the_module(cfg: GPTConfig) -> None:
    assert GPT(cfg).num_params() == cfg.n_params()


def test_embeddings_are_tied_and_loss_ignores_padding() -> None:
    torch.manual_seed(0)
    model = GPT(preset("tiny"))
    assert model.lm_head.weight is model.wte.weight
    x = torch.randint(0, 256, (2, 16))
    y = torch.randint(0, 256, (2, 16))
    y_pad = y.clone()
    y_pad[:, 12:] = -1
    x_pad = x.clone()
    x_pad[:, 12:] = 0
    full = model(x[:, :12], y[:, :12])
    padded = model(x_pad, y_pad)  # causal: padding at the end cannot change earlier tokens
    torch.testing.assert_close(full, padded)
    assert model(x).shape == (2, 16, 256)


def test_presets_have_the_advertised_sizes() -> None:
    assert abs(PRESETS["gpt2-124m"].n_params() - 124e6) / 124e6 < 0.01
    assert abs(PRESETS["gpt2-350m"].n_params() - 355e6) / 355e6 < 0.02
    assert abs(PRESETS["llama-7b"].n_params() - 6.74e9) / 6.74e9 < 0.01


def test_bad_shape_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=65, n_head=4)
    with pytest.raises(ValueError, match="unknown preset"):
        preset("gpt5")
