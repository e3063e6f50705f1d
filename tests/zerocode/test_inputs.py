"""How ``gpudash run`` counts a forward's samples and tokens (gpudash/zerocode/inputs.py): unbatched inputs
count 1, packed sequences, ``model(**batch)`` and lists; shapes only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpudash.zerocode.inputs import samples_tokens, unbatched  # noqa: E402


def test_unbatched_inputs_count_one_sample() -> None:
    policy = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 2))  # an actor-critic's policy
    assert samples_tokens(policy, (torch.zeros(4),), {}) == (1, None)  # one CartPole state
    assert samples_tokens(policy, (torch.zeros(5, 4),), {}) == (5, None)
    assert samples_tokens(policy, (torch.tensor(1.0),), {}) == (1, None)
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten())
    assert samples_tokens(conv, (torch.zeros(3, 16, 16),), {}) == (1, None)  # one image (C, H, W)
    assert samples_tokens(conv, (torch.zeros(2, 3, 16, 16),), {}) == (2, None)
    rnn = nn.LSTM(6, 8)
    assert samples_tokens(rnn, (torch.zeros(10, 6),), {}) == (1, None)  # one sequence (L, H_in)
    assert samples_tokens(rnn, (torch.zeros(10, 3, 6),), {}) == (3, None)  # (length, batch, features)
    assert samples_tokens(nn.GRU(6, 8, batch_first=True), (torch.zeros(10, 3, 6),), {}) == (10, None)
    lm = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    assert samples_tokens(lm, (torch.zeros(12, dtype=torch.long),), {}) == (1, 12)  # one sequence of 12 tokens
    assert samples_tokens(lm, (torch.zeros(3, 12, dtype=torch.long),), {}) == (3, 36)


@settings(max_examples=60, deadline=None)
@given(features=st.integers(1, 6), dims=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_a_linear_first_layer_reads_one_sample_only_from_a_1d_input_of_its_width(features: int, dims: list[int]) -> None:
    x = torch.zeros(*dims)
    one = unbatched(nn.Linear(features, 2), x)
    assert one == (len(dims) == 1 and dims[0] == features)
    assert samples_tokens(nn.Linear(features, 2), (x,), {})[0] == (1 if one else dims[0])


def test_packed_sequences() -> None:
    seqs = [torch.zeros(5, 3), torch.zeros(3, 3), torch.zeros(2, 3)]
    packed = nn.utils.rnn.pack_sequence(seqs)
    assert samples_tokens(nn.LSTM(3, 4), (packed,), {}) == (3, 10)
    # sequences packed into one row: position_ids restart at 0 for each (Hugging Face packing collators)
    ids = torch.zeros(1, 9, dtype=torch.long)
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2]])
    lm = nn.Embedding(10, 4)
    assert samples_tokens(lm, (), {"input_ids": ids, "position_ids": pos}) == (3, 9)
    assert samples_tokens(lm, (ids,), {"position_ids": pos}) == (3, 9)


def test_dict_batches_from_input_ids_and_attention_mask() -> None:
    lm = nn.Embedding(10, 4)
    batch = {"input_ids": torch.zeros(4, 7, dtype=torch.long), "attention_mask": torch.ones(4, 7),
             "labels": torch.zeros(4, dtype=torch.long)}
    assert samples_tokens(lm, (), batch) == (4, 28)  # model(**batch): padding included, no GPU sync
    assert samples_tokens(lm, (batch,), {}) == (4, 28)  # model(batch)
    embeds = {"inputs_embeds": torch.zeros(2, 5, 4), "attention_mask": torch.ones(2, 5)}
    assert samples_tokens(lm, (), embeds) == (2, 10)  # no input_ids: the mask stands for them
    assert samples_tokens(lm, (), {"pixel_values": torch.zeros(6, 3, 8, 8)}) == (6, None)
    assert samples_tokens(lm, (), {"flag": True}) == (None, None)


def test_lists_and_ambiguous_inputs() -> None:
    m = nn.Linear(3, 1)
    images = [torch.zeros(3, 8, 8), torch.zeros(3, 6, 6)]  # torchvision detection models take a list
    assert samples_tokens(m, (images,), {}) == (2, None)
    seqs = [torch.zeros(4, dtype=torch.long), torch.zeros(6, dtype=torch.long)]
    assert samples_tokens(m, (seqs,), {}) == (2, 10)
    assert samples_tokens(m, (torch.zeros(4, 3), torch.zeros(5, 3)), {}) == (None, None)  # disagree on dim 0
    assert samples_tokens(m, (torch.zeros(4, 16, dtype=torch.long), torch.ones(4, 16)), {}) == (4, 64)
    assert samples_tokens(m, (), {}) == (None, None)
