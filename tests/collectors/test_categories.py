"""CategoryCollector pieces: the activation sampler's budget, trainable and quantized parameter bytes."""

from __future__ import annotations

import pytest

from gpudash.collectors.categories import AdaptiveEvery, param_storages

torch = pytest.importorskip("torch")


def _run_sampler(durations: list[float], cost: float) -> list[int]:
    """Steps sampled by an AdaptiveEvery whose sampled steps cost ``cost`` seconds more than ``durations``."""
    s = AdaptiveEvery(0, 0.005, first=1)
    sampled = []
    for step, d in enumerate(durations):
        if s.due(step):
            sampled.append(step)
            s.done(step, cost, d + cost)
        else:
            s.observe_step(d)
    return sampled


def test_a_slow_first_step_does_not_pin_the_baseline() -> None:
    # a 2 s first step (compile, warm-up, evaluation), then 10 ms steps; sampling costs 1 ms a step
    sampled = _run_sampler([2.0] + [0.01] * 299, 0.001)
    # 1 ms against 10 ms steps at a 0.5 % budget: one sampled step in every 20, from the first ones on
    assert len(sampled) <= 300 // 20 + 2
    assert sampled[0] == 1 and sampled[1] - sampled[0] >= 19
    assert _run_sampler([0.01] * 300, 0.001) == _run_sampler([5.0] + [0.01] * 299, 0.001)


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
