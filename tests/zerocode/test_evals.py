"""Evaluations under ``gpudash run`` (gpudash/zerocode/evals.py): at the step whose weights they evaluated, one
event per loader (its split and its own eval_loss), and generation its own phase, not an evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from gpudash import load_run  # noqa: E402
from gpudash.zerocode.agent import Agent  # noqa: E402


class _TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)

    def forward(self, idx: Any, targets: Any = None) -> Any:
        logits = self.head(self.emb(idx))
        if targets is None:
            return logits, None
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class _Split(TensorDataset):
    split = "validation"  # as Hugging Face datasets name theirs


def _evaluate(model: _TinyLM, loader: DataLoader) -> float:  # type: ignore[type-arg]
    model.eval()
    losses = []
    with torch.no_grad():
        for x, y in loader:
            losses.append(model(x, y)[1].item())
    model.train()
    return sum(losses) / len(losses)


def _generate(model: _TinyLM, idx: Any, new: int) -> Any:
    model.eval()
    with torch.no_grad():
        for _ in range(new):  # nanoGPT's sampling: the sequence grows by one token a call, no loss
            logits, _ = model(idx)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    model.train()
    return idx


def test_evaluations_at_their_step_per_loader_and_generation_apart(tmp_path: Path) -> None:
    torch.manual_seed(0)
    agent = Agent(str(tmp_path / "run"), {"host_hz": 0, "handle_signals": False})
    agent.install(torch)
    model = _TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = lambda n: (torch.randint(0, 11, (n, 6)), torch.randint(0, 11, (n, 6)))  # noqa: E731
    train = DataLoader(TensorDataset(*data(16)), batch_size=4)  # 4 batches: evaluated as the first loader met
    val = DataLoader(_Split(*data(12)), batch_size=4)  # 3 batches: "validation"
    printed: dict[int, tuple[float, float]] = {}
    try:
        initial = _evaluate(model, val)  # the initial weights
        step = 0
        for x, y in train:
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step in (1, 3):  # right after steps 1 and 3: both splits, then a sample
                printed[step] = (_evaluate(model, train), _evaluate(model, val))
                _generate(model, torch.zeros(1, 2, dtype=torch.long), 5)
            step += 1
    finally:
        agent.stop()
    run = load_run(tmp_path / "run")
    try:
        ev = run.events[run.events["kind"] == "evaluation"]
        got = [(int(s), d.get("split"), d["after_steps"], d["metrics"])
               for s, d in zip(ev["step"], ev["data"], strict=True)]
        assert [(s, split, after) for s, split, after, _ in got] == [
            (0, "validation", 0), (1, "eval1", 2), (1, "validation", 2), (3, "eval1", 4), (3, "validation", 4)]
        assert got[0][3]["eval_loss"] == pytest.approx(initial, rel=1e-6)
        for s, split, _, m in got[1:]:
            want = printed[s][0 if split == "eval1" else 1]
            assert m["eval_loss"] == pytest.approx(want, rel=1e-6)  # each split its own mean, never mixed
            assert m["eval_batches"] == (4 if split == "eval1" else 3)
        s = run.steps.set_index("step")
        assert list(s.index) == [0, 1, 2, 3]
        # work done between steps k and k+1 sits in row k+1: the evaluations after step 1 in row 2
        assert s.loc[2, "eval_s"] > 0 and s.loc[2, "generate_s"] > 0
        assert s.loc[[1, 3], "generate_s"].isna().all()  # the sample after the last step is in no row
        from gpudash.analysis.bottleneck import phase_shares

        shares = phase_shares(run.steps, run.meta).set_index("step")
        assert shares.loc[2, "eval"] > 0  # generation is time between steps too, not compute
    finally:
        run.close()


def test_generation_alone_is_not_an_evaluation(tmp_path: Path) -> None:
    agent = Agent(str(tmp_path / "run"), {"host_hz": 0, "handle_signals": False})
    agent.install(torch)
    try:
        _generate(_TinyLM(), torch.zeros(2, 3, dtype=torch.long), 4)
    finally:
        agent.stop()
    run = load_run(tmp_path / "run")
    try:
        assert (run.events["kind"] == "evaluation").sum() == 0
        assert "1 generation(s)" in run.meta["no_steps_reason"]
    finally:
        run.close()


def test_hf_generate_with_a_cache_is_generation(tmp_path: Path) -> None:
    """A Hugging Face causal LM trained a step, evaluated with labels, then ``generate()`` (a key/value cache: one
    token a call after the prompt): the evaluation is an event at step 0, the sampling the generate phase."""
    pytest.importorskip("transformers")
    from helpers.tiny_hf import TINY, build

    agent = Agent(str(tmp_path / "run"), {"host_hz": 0, "handle_signals": False})
    agent.install(torch)
    try:
        model = build(TINY["llama"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(1, 300, (2, 12))
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            model.eval()
            with torch.no_grad():
                printed = model(input_ids=ids, labels=ids).loss.item()
                model.generate(ids[:, :4], max_new_tokens=6, do_sample=False, pad_token_id=0)
            model.train()
    finally:
        agent.stop()
    run = load_run(tmp_path / "run")
    try:
        ev = run.events[run.events["kind"] == "evaluation"]
        assert ev["step"].tolist() == [0, 1]  # one evaluation each, the generations not among them
        assert ev["data"].iloc[1]["metrics"]["eval_loss"] == pytest.approx(printed, rel=1e-5)
        s = run.steps.set_index("step")
        assert s.loc[1, "generate_s"] > 0 and s.loc[1, "eval_s"] > 0
        assert (s["samples"] == 2).all() and (s["tokens"] == 24).all()  # model(input_ids=..., labels=...)
    finally:
        run.close()
