"""Held-out scores: the same positions for model and unigram, perplexity and bits per byte as defined."""

import math

import pytest
import torch
import torch.nn.functional as F

from tandem.model import Transformer
from tandem.zoo.evaluate import HeldoutScore, model_score, top1_agreement, unigram_counts, unigram_score
from tandem.zoo.shapes import TINY_DRAFT_SHAPE, TINY_TARGET_SHAPE, model_config
from tandem.zoo.tokens import eval_windows
from tandem.zoo.train import init_weights


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = Transformer(model_config(TINY_TARGET_SHAPE, 50, 32, 0, 1)).eval()
    draft = Transformer(model_config(TINY_DRAFT_SHAPE, 50, 32, 0, 1)).eval()
    return target, draft


def test_score_units():
    score = HeldoutScore(tokens=100, loss=2.0)
    assert score.perplexity == pytest.approx(math.exp(2.0))
    assert score.bits_per_byte(num_bytes=400) == pytest.approx(2.0 * 100 / math.log(2) / 400)


def test_model_score_is_mean_next_token_cross_entropy(models):
    target, _ = models
    stream = torch.randint(0, 50, (70,), generator=torch.Generator().manual_seed(1))
    score = model_score(target, eval_windows(stream, 16))
    with torch.no_grad():  # one long pass differs only in context: compare window by window
        expected = [
            F.cross_entropy(target.logits(target(w[None, :-1]))[0], w[1:], reduction="sum")
            for w in eval_windows(stream, 16)
        ]
    assert score.tokens == 69
    assert score.loss == pytest.approx(sum(e.item() for e in expected) / 69, rel=1e-5)


def test_unigram_uses_add_one_smoothed_training_frequencies():
    counts = unigram_counts(torch.tensor([3, 3, 3, 4]), vocab_size=6)
    assert counts.tolist() == [0, 0, 0, 3, 1, 0]
    score = unigram_score(counts, [torch.tensor([9, 3, 5])])  # first token of a window is context only
    expected = -(math.log(4 / 10) + math.log(1 / 10)) / 2
    assert score.tokens == 2 and score.loss == pytest.approx(expected)


def test_agreement_counts_positions_where_greedy_choices_match(models):
    target, draft = models
    init_weights(draft, seed=4, std=0.5)  # untrained and loud: disagrees with the target often
    windows = eval_windows(torch.randint(0, 50, (100,), generator=torch.Generator().manual_seed(2)), 16)
    with torch.no_grad():
        same = [
            (target.logits(target(w[None, :-1])).argmax(-1) == draft.logits(draft(w[None, :-1])).argmax(-1))
            for w in windows
        ]
    expected = torch.cat([s.flatten() for s in same]).float().mean().item()
    assert top1_agreement(target, draft, windows) == pytest.approx(expected)
    assert expected < 0.9
    assert top1_agreement(target, target, windows) == 1.0
