"""A backbone as functions of tensor dicts: its `body` (feature extractor φ) and `head` (ψ) called with the tensors a
client's state holds (`torch.func.functional_call`), so that one module serves every client of a stacked cohort."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from algorithms.common import State


class Net:
    """Functional view of a backbone with `body` (feature extractor) and `head` submodules."""

    def __init__(self, backbone: nn.Module):
        self.module = backbone
        self.feature_dim: int = backbone.feature_dim
        self.param_keys = [k for k, _ in backbone.named_parameters()]
        self.buffer_keys = [k for k, _ in backbone.named_buffers()]
        self._local = {
            part: [k for k, _ in getattr(backbone, part).named_parameters()]
            + [k for k, _ in getattr(backbone, part).named_buffers()]
            for part in ("body", "head")
        }
        # The backbone in eval mode, whatever mode the engine's pass is in (`predict`): every tensor it reads is
        # handed in, so its own live on the meta device, taking no memory.
        self._evaluating = copy.deepcopy(backbone).to("meta").eval()

    def initial_state(self) -> State:
        return {k: v.detach().clone() for k, v in self.module.state_dict(keep_vars=True).items()}

    def _call(
        self, part: str, state: State, prefix: str, inp: torch.Tensor, module: nn.Module | None = None
    ) -> torch.Tensor:
        tensors = {k: state[prefix + k] for k in self._local[part]}
        return functional_call(getattr(module or self.module, part), tensors, (inp,))

    def features(self, state: State, x: torch.Tensor, prefix: str = "body.") -> torch.Tensor:
        return self._call("body", state, prefix, x)

    def head(self, state: State, h: torch.Tensor, prefix: str = "head.") -> torch.Tensor:
        return self._call("head", state, prefix, h)

    def is_buffer(self, key: str) -> bool:
        """BatchNorm statistics, of the backbone or of a copy of it under another prefix
        ("global.body.bn1.running_mean")."""
        return key.endswith(tuple(self.buffer_keys))

    def logits(self, state: State, x: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """The whole backbone; `prefix` names a copy of it held in the same state ("global.")."""
        return self.head(state, self.features(state, x, prefix + "body."), prefix + "head.")

    def predict(self, state: State, x: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """The whole backbone in eval mode even inside a training step: BatchNorm normalizes with the running
        statistics and writes none (a frozen model's `.eval()` in the reference code: FedNTD's received model)."""
        h = self._call("body", state, prefix + "body.", x, self._evaluating)
        return self._call("head", state, prefix + "head.", h, self._evaluating)

    def copy(self, model: State, prefix: str) -> State:
        """A second model in a client's state: the backbone's tensors under `prefix`."""
        return {prefix + k: model[k].clone() for k in self.param_keys + self.buffer_keys}

    def fresh(self, seed: int) -> State:
        """Another random initialisation of the backbone, the same for a given seed on every device
        (k-model methods): drawn on a CPU copy from the CPU generator alone, then moved."""
        device = next(self.module.parameters()).device
        module = copy.deepcopy(self.module).cpu()
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)  # torch.manual_seed would reseed CUDA's, unrestored
            for m in module.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        return {k: v.detach().to(device, copy=True) for k, v in module.state_dict(keep_vars=True).items()}

    def stacked(self, models: list[State], prefix: str) -> State:
        """Several models in one state: each tensor under `prefix`, stacked along a new dim 0."""
        return {prefix + k: torch.stack([m[k] for m in models]) for k in self.param_keys + self.buffer_keys}

    def keys(self, prefixes: tuple[str, ...], params_only: bool = True) -> list[str]:
        pool = self.param_keys if params_only else self.param_keys + self.buffer_keys
        return [k for k in pool if k.startswith(prefixes)]
