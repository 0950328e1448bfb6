"""FedEM (Marfoq et al., NeurIPS 2021): each client's data is a mixture of M shared components.

Shared: M component models ("em.model.", stacked), from M random initialisations.
Personal: the mixture weights π_i ("em.pi").
Local round (Algorithm 1): E-step, π_i ← mean over the client's samples of the responsibilities
q(m | x, y) ∝ π_im p_m(y | x) (one pass); M-step, the local epochs on Σ_m q(m | x, y) · CE_m,
q recomputed per batch with the components held fixed.
Upload: the components. Server: sample-weighted mean of each component.
Prediction: p(y | x) = Σ_m π_im p_m(y | x).
FedEM-FT fine-tunes the components locally before evaluation, as FedPAC's Table 1 runs it.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import vmap

from algorithms.base import Method, substate, variant

MODELS, PI = "em.model.", "em.pi"


@dataclass
class FedEMHparams:
    m: int = 3  # number of components
    ft_epochs: int = 0  # fine-tuning epochs of the components before evaluation (FedEM-FT)


class FedEM(Method):
    name = "fedem"
    title = "FedEM"
    Hparams = FedEMHparams
    shared = (MODELS,)
    stats_before = True  # the E-step

    def init_client(self, model):
        models = [model] + [self.net.fresh(seed) for seed in range(1, self.hp.m)]
        device = model[self.net.param_keys[0]].device
        stacked = {k: v.to(device) for k, v in self.net.stacked(models, MODELS).items()}
        return {**stacked, PI: torch.full((self.hp.m,), 1.0 / self.hp.m, device=device)}

    def component_log_probs(self, state, x):
        """log p_m(· | x) for every component: (M, batch, classes)."""
        buffers = {k: state[MODELS + k] for k in self.net.buffer_keys}

        def one(params, bufs):
            return F.log_softmax(self.net.logits({**params, **bufs}, x), -1)

        return vmap(one)({k: state[MODELS + k] for k in self.net.param_keys}, buffers)

    def responsibilities(self, state, x, y):
        log_p = self.component_log_probs(state, x)
        log_py = log_p.gather(-1, y.expand(log_p.shape[0], -1)[..., None])[..., 0]  # (M, batch)
        return torch.softmax(torch.log(state[PI].clamp(min=1e-12))[:, None] + log_py, 0), log_py

    def statistics(self, state, server, x, y, w):
        q, _ = self.responsibilities(state, x, y)
        return {"q": (q * w).sum(1), "n": w.sum()}

    def begin_local(self, client, server, stats):
        return {PI: stats["q"] / stats["n"].clamp(min=1)}  # E-step

    def phases(self):
        return [self.sgd((MODELS,))]

    def loss(self, state, server, x, y):
        q, log_py = self.responsibilities(state, x, y)
        return -(q.detach() * log_py).sum(0).mean()  # M-step: responsibility-weighted cross-entropy

    def logits(self, state, server, x):
        return torch.logsumexp(torch.log(state[PI].clamp(min=1e-12))[:, None, None] + self.component_log_probs(state, x), 0)

    def eval_phases(self):
        return [self.sgd((MODELS,), self.hp.ft_epochs)] if self.hp.ft_epochs else []


# FedPAC's Table 1
VARIANTS = [
    variant(FedEM, "FedEM-M3", m=3),
    variant(FedEM, "FedEM-M5", m=5),
    variant(FedEM, "FedEM-FT-M3", m=3, ft_epochs=1),
    variant(FedEM, "FedEM-FT-M5", m=5, ft_epochs=1),
]
