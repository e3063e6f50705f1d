from __future__ import annotations

from gpudash.trainer.data import (
    MAX_LENGTH_RATIO,
    MAX_PADDING,
    ByteTokenizer,
    LengthBuckets,
    corpus_samples,
    micro_batches,
    padding_fraction,
)


def test_tokenizer_round_trips_text() -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("déjà vu = 42\n")) == "déjà vu = 42\n"


def test_samples_are_deterministic_and_within_length_bounds() -> None:
    a = corpus_samples(200, min_len=8, max_len=64, seed=3)
    assert a == corpus_samples(200, min_len=8, max_len=64, seed=3)
    assert all(9 <= len(s) <= 65 for s in a)
    assert len({len(s) for s in a}) > 20  # variable length


def test_a_batch_never_mixes_lengths_more_than_30_percent_apart() -> None:
    data = LengthBuckets(corpus_samples(1000, min_len=8, max_len=128), batch_size=16, seed=1)
    for _ in range(200):
        lengths = [len(s) for s in next(data)]
        assert max(lengths) <= MAX_LENGTH_RATIO * min(lengths)


def test_micro_batches_split_padding_over_15_percent_and_use_every_sample_once() -> None:
    samples = [[1] * n for n in (40, 39, 38, 31, 30, 30, 30, 31)]  # within 30 %, but 40 vs 30 pads > 15 %
    assert padding_fraction([len(s) - 1 for s in samples]) > MAX_PADDING
    mbs = micro_batches(samples, 8)
    assert len(mbs) > 1
    assert sum(mb.size for mb in mbs) == len(samples)
    assert sum(mb.tokens for mb in mbs) == sum(len(s) - 1 for s in samples)
    for mb in mbs:
        real = (mb.y >= 0).sum(dim=1).tolist()
        assert padding_fraction(real) <= MAX_PADDING
        assert (mb.y[:, : min(real)] >= 0).all()


def test_micro_batch_size_caps_rows() -> None:
    samples = [[7] * 20 for _ in range(10)]
    mbs = micro_batches(samples, 3)
    assert [mb.size for mb in mbs] == [3, 3, 3, 1]
    assert all(mb.x.shape[1] == 19 for mb in mbs)
