"""Token windows: files framed by <s> ... </s>, evaluation covering each token once, seeded batches."""

import pytest
import torch

from tandem.zoo.corpus import SourceFile
from tandem.zoo.tokenizer import train_tokenizer
from tandem.zoo.tokens import WindowSampler, encode_files, eval_windows


def test_files_are_framed_and_concatenated():
    tokenizer = train_tokenizer(["a = 1\n", "b = 2\n"] * 10, vocab_size=300)
    files = [SourceFile("a.py", "a = 1\n"), SourceFile("b.py", "b = 2\n")]
    stream = encode_files(tokenizer, files, bos_id=0, eos_id=1).tolist()
    first = tokenizer.encode("a = 1\n", add_special_tokens=False).ids
    second = tokenizer.encode("b = 2\n", add_special_tokens=False).ids
    assert stream == [0, *first, 1, 0, *second, 1]


@pytest.mark.parametrize("length", [1, 2, 9, 10, 11, 37])
def test_eval_windows_predict_every_token_once(length):
    stream = torch.arange(length)
    windows = eval_windows(stream, seq_len=4)
    targets = [t for w in windows for t in w[1:].tolist()]
    assert targets == list(range(1, length))
    assert all(len(w) <= 5 for w in windows)


def test_sampler_batches_are_seeded_contiguous_windows():
    stream = torch.arange(1000)
    a = WindowSampler(stream, seq_len=16, batch_size=4, seed=3)
    b = WindowSampler(stream, seq_len=16, batch_size=4, seed=3)
    c = WindowSampler(stream, seq_len=16, batch_size=4, seed=4)
    batches_a = [a.next_batch() for _ in range(40)]  # several epochs of ~61 windows
    assert all(torch.equal(x, b.next_batch()) for x in batches_a)
    assert not all(torch.equal(x, c.next_batch()) for x in batches_a)
    for batch in batches_a:
        assert batch.shape == (4, 17)
        assert torch.equal(batch - batch[:, :1], torch.arange(17).expand(4, -1))
        assert int(batch.max()) < 1000
    assert a.epochs_started >= 2


def test_each_epoch_visits_every_window_once():
    sampler = WindowSampler(torch.arange(200), seq_len=10, batch_size=1, seed=0)
    starts = [int(sampler.next_batch()[0, 0]) for _ in range(sampler.windows_per_epoch)]
    assert len(set(starts)) == len(starts) and len({s % 10 for s in starts}) == 1


def test_sampler_refuses_a_stream_shorter_than_two_windows():
    with pytest.raises(ValueError, match="too short"):
        WindowSampler(torch.arange(20), seq_len=16, batch_size=2, seed=0)
