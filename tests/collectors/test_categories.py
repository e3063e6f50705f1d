"""CategoryCollector pieces: the activation schedule's cap, trainable and quantized parameter bytes."""

from __future__ import annotations

import pytest

from gpudash.collectors.categories import StepSchedule, param_storages

torch = pytest.importorskip("torch")


def test_the_budget_sets_the_cap_of_the_gaps() -> None:
    # the default 0.5 %: every 256th step in a long run; a tiny budget spreads them further, up to 1024
    assert StepSchedule(0, 0.005).cap == 256
    assert StepSchedule(0, 0.0001).cap == 1024
    assert StepSchedule(0, 0.25).cap == 4
    s = StepSchedule(0, 0.005)
    s.first = 1  # frameworks that count from 1 (HF)
    sampled = [k for k in range(1, 3000) if s.due(k)]
    assert sampled[:12] == [*range(2, 10), 17, 33, 65, 129] and sampled[12:15] == [257, 513, 769]
    assert len(sampled) == 8 + 4 + (3000 - 2) // 256


class Params4bit(torch.nn.Parameter):
    """A stand-in for bitsandbytes' 4-bit parameter (bitsandbytes needs CUDA and is not installed here): the
    collector knows it by its class name and a ``quant_state`` with ``absmax`` and ``code`` tensors."""


class _QuantState:
    def __init__(self) -> None:
        self.absmax = torch.ones(8)  # fp32 constants, one per block of 64
        self.code = torch.zeros(16)
        self.state2 = None


def test_trainable_and_quantized_bytes() -> None:
    frozen = torch.nn.Parameter(torch.zeros(10, 10), requires_grad=False)
    lora = torch.nn.Parameter(torch.zeros(10, 2))
    q = Params4bit(torch.zeros(256, dtype=torch.uint8), requires_grad=False)  # 512 4-bit values in 256 bytes
    q.quant_state = _QuantState()
    seen, trainable, dtypes = param_storages([frozen, lora, q, lora])
    assert sum(seen.values()) == 400 + 80 + 256 + 4 * 8 + 4 * 16
    assert sum(trainable.values()) == 80
    assert dtypes == {"float32": 480, "uint8 (Params4bit)": 256 + 32 + 64}
