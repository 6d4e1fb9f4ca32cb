"""A third-party optimizer: scales the LM head by a factor (a temperature baked into the weights).

It knows tandem only through the contract: an object with name, version, description and
optimize(OptimizedModel) -> OptimizedModel, exposed through the `tandem.optimizers` entry point as a
factory taking the recipe's keyword parameters.
"""

import copy
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class ScaleLogits:
    factor: float = 2.0
    name: str = "scale-logits"
    version: str = "0.1.0"
    description: str = "multiply the LM head by a factor (third-party example)"

    def optimize(self, model):
        loaded = model.model
        module = copy.deepcopy(loaded.module)
        module.lm_head = copy.deepcopy(module.lm_head)
        with torch.no_grad():
            module.lm_head.weight.mul_(self.factor)
        return model.with_changes(model=replace(loaded, module=module))
