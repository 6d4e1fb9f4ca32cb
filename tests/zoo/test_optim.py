"""Optimizer setup: Muon takes the transformer's matrices, AdamW everything else, each parameter once."""

import pytest
import torch

from tandem.model import Transformer
from tandem.zoo.optim import build_optimizer, set_lr
from tandem.zoo.shapes import TINY_TARGET_SHAPE, model_config


def _module() -> Transformer:
    return Transformer(model_config(TINY_TARGET_SHAPE, vocab_size=64, max_positions=32, bos_id=0, eos_id=1))


def test_muon_gets_hidden_matrices_and_adamw_the_rest():
    module = _module()
    optimizer = build_optimizer(module, "muon", lr=1e-3, weight_decay=0.1)
    muon, adamw = optimizer.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    in_adamw = {id(p) for g in adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in module.named_parameters()}
    assert not in_muon & in_adamw and in_muon | in_adamw == set(names)
    assert {names[i] for i in in_muon} == {
        n for n, p in module.named_parameters() if n.startswith("layers.") and p.dim() == 2
    }
    assert "embed_tokens.weight" in {names[i] for i in in_adamw}
    norms = [g for g in adamw.param_groups if any(p.dim() == 1 for p in g["params"])]
    assert all(g["weight_decay"] == 0.0 for g in norms)


@pytest.mark.parametrize("kind", ["muon", "adamw"])
def test_a_step_moves_every_parameter_and_set_lr_reaches_every_group(kind):
    module = _module()
    optimizer = build_optimizer(module, kind, lr=1e-2, weight_decay=0.0)
    before = [p.detach().clone() for p in module.parameters()]
    module.logits(module(torch.randint(0, 64, (2, 8)))).logsumexp(-1).mean().backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    set_lr(optimizer, 0.5)
    assert all(g["lr"] == 0.5 for o in optimizer.optimizers for g in o.param_groups)


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="muon"):
        build_optimizer(_module(), "sgd", lr=1e-3, weight_decay=0.0)
