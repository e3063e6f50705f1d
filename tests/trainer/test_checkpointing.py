from __future__ import annotations

import pytest
import torch

from gpudash.trainer.checkpointing import apply_checkpointing, parse_mode
from gpudash.trainer.model import GPT, preset

MODES = ["block", "every-2", "attn", "mlp"]
# whole-length samples: every step has the same shape, so runs compare row by row
SAME_SHAPE = {"seq_len": 64, "min_len": 64, "batch": 8, "steps": 3}


@pytest.mark.parametrize("mode", MODES)
def test_checkpointing_keeps_loss_and_gradients_identical(mode: str) -> None:
    x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, dims=1)
    grads = []
    for m in ("none", mode):
        torch.manual_seed(0)
        model = GPT(preset("tiny"))
        assert apply_checkpointing(model, parse_mode(m)) == (0 if m == "none" else {"block": 4, "every-2": 2}.get(m, 4))
        loss = model(x, y)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_every_mode_trains_to_the_same_losses_as_none(run_train) -> None:  # type: ignore[no-untyped-def]
    base = run_train("none", ckpt="none", **SAME_SHAPE).steps["loss"].to_numpy()
    for mode in MODES:
        losses = run_train(mode, ckpt=mode, **SAME_SHAPE).steps["loss"].to_numpy()
        assert len(losses) == 3
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(base), rtol=1e-5, atol=1e-6)


def test_block_checkpointing_cuts_measured_activations_by_60_percent(run_train) -> None:  # type: ignore[no-untyped-def]
    none = run_train("none", ckpt="none", **SAME_SHAPE).memory["activations_bytes"].max()
    block = run_train("block", ckpt="block", **SAME_SHAPE).memory["activations_bytes"].max()
    assert none > 0 and block > 0
    assert 1 - block / none >= 0.60


def test_bad_mode_names_the_choices() -> None:
    with pytest.raises(ValueError, match="every-N"):
        parse_mode("every-0")
    assert parse_mode("every-1").label() == "block"
    assert parse_mode("every-3").layer(3) == (True, False, False)
