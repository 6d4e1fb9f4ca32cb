"""Optimizers that are wrong in the ways the validation gate exists to catch (test fixtures).

Installed as their own distribution, found through the `tandem.optimizers` entry point like any
third-party optimizer; tandem and its gate know nothing of them:
- `corrupt-weights`: fast but wrong: seeded Gaussian noise on every projection of every layer
  (`noise` times each weight matrix's own standard deviation); as fast as the model it corrupts.
- `slow-steps`: right but slow: every forward pass (one per engine step) first sleeps `delay_ms`.
- `failing-steps`: every forward pass raises, so every request fails (the server stays up).
- `flaky-steps`: right but slow (`delay_ms` before each forward pass) until armed, then fails: once
  the file named by $FLAKY_STEPS_ARMED exists, every forward pass after the `fail_after`-th raises
  (a kernel that faults a few decode steps into a stream; the server stays up).
"""

import copy
import os
import time
from dataclasses import dataclass, replace

import torch
from torch import nn


def _copy(model):
    loaded = model.model
    return loaded, copy.deepcopy(loaded.module)


@dataclass(frozen=True)
class CorruptWeights:
    noise: float = 1.0
    seed: int = 0
    name: str = "corrupt-weights"
    version: str = "0.1.0"
    description: str = "add Gaussian noise to every layer's weights (a broken quantizer; test fixture)"

    def optimize(self, model):
        loaded, module = _copy(model)
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for layer in module.layers:
                for linear in layer.modules():
                    if isinstance(linear, nn.Linear):
                        weight = linear.weight
                        noise = torch.randn(weight.shape, generator=generator, dtype=torch.float32)
                        weight.add_((noise * self.noise * weight.float().std()).to(weight.dtype))
        return model.with_changes(model=replace(loaded, module=module))


@dataclass(frozen=True)
class SlowSteps:
    delay_ms: float = 30.0
    name: str = "slow-steps"
    version: str = "0.1.0"
    description: str = "sleep before every forward pass (a slow kernel; test fixture)"

    def optimize(self, model):
        loaded, module = _copy(model)
        delay_s = self.delay_ms / 1000
        module.register_forward_pre_hook(lambda *_: time.sleep(delay_s))
        return model.with_changes(model=replace(loaded, module=module))


@dataclass(frozen=True)
class FailingSteps:
    name: str = "failing-steps"
    version: str = "0.1.0"
    description: str = "raise in every forward pass (a crashing kernel; test fixture)"

    def optimize(self, model):
        loaded, module = _copy(model)

        def fail(*_):
            raise RuntimeError("failing-steps: this optimizer breaks every forward pass")

        module.register_forward_pre_hook(fail)
        return model.with_changes(model=replace(loaded, module=module))


@dataclass(frozen=True)
class FlakySteps:
    delay_ms: float = 20.0
    fail_after: int = 5
    name: str = "flaky-steps"
    version: str = "0.1.0"
    description: str = "slow steps that fail a few steps after being armed (a faulty kernel; test fixture)"

    def optimize(self, model):
        loaded, module = _copy(model)
        delay_s, armed, steps = self.delay_ms / 1000, os.environ.get("FLAKY_STEPS_ARMED", ""), [0]

        def step(*_):
            time.sleep(delay_s)
            if armed and os.path.exists(armed):
                steps[0] += 1
                if steps[0] > self.fail_after:
                    raise RuntimeError(f"flaky-steps: armed, failing after {self.fail_after} steps")

        module.register_forward_pre_hook(step)
        return model.with_changes(model=replace(loaded, module=module))
