"""FedEM (Marfoq et al., NeurIPS 2021): each client's data is a mixture of M shared components.

Shared: M component models ("em.model.", stacked), from M random initialisations.
Personal: the mixture weights π_i ("em.pi").
Local round (Algorithm 1): E-step, q(m | x, y) ∝ π_im p_m(y | x) for every sample and
π_i ← the mean of q (one pass); M-step, the local epochs on Σ_m q(m | x, y) · CE_m with q the
E-step's, fixed through the M-step: it is recomputed per batch from a copy of the round's
starting components and π ("em.estep.", not trained), which gives the E-step's values without
storing one row per training sample.
Upload: the components. Server: sample-weighted mean of each component.
Prediction: p(y | x) = Σ_m π_im p_m(y | x).
FedEM-FT fine-tunes the components locally before evaluation (FedPAC's Table 4), each on the
responsibility-weighted loss of the M-step, for as many epochs as the run's local training: the
authors' Client.update_tuned_learners (omarfoq/FedEM, client.py) fits each tuned learner for
`local_steps` epochs weighted by its samples' responsibilities. The tuned ensemble predicts with uniform
weights 1/M, as the authors' does (its learners_weights are copied once, at their uniform start, and never
updated); `ft_mix="pi"` weighs it by the client's π_i instead, as FedEM itself predicts.
"""

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch.func import vmap

from algorithms.base import Method
from algorithms.variants import variant

MODELS, PI, ESTEP = "em.model.", "em.pi", "em.estep."


@dataclass
class FedEMHparams:
    m: int = 3  # number of components
    ft_epochs: int | None = (
        # fine-tuning epochs of the components before evaluation: 0 none (FedEM), None the run's local epochs (FedEM-FT)
        0
    )
    # FedEM-FT's prediction: "uniform" 1/M (the authors' tuned ensemble) or "pi" (π_i)
    ft_mix: Literal["uniform", "pi"] = "uniform"


class FedEM(Method):
    name = "fedem"
    title = "FedEM"
    origin = "baseline"
    paper = "Marfoq et al., NeurIPS 2021"
    source = "omarfoq/FedEM"
    Hparams = FedEMHparams
    shared = (MODELS,)

    def init_client(self, model):
        models = [model] + [self.net.fresh(seed) for seed in range(1, self.hp.m)]
        device = model[self.net.param_keys[0]].device
        stacked = {k: v.to(device) for k, v in self.net.stacked(models, MODELS).items()}
        pi = torch.full((self.hp.m,), 1.0 / self.hp.m, device=device)
        estep = {ESTEP + k: v.clone() for k, v in stacked.items()}
        return {**stacked, PI: pi, **estep, ESTEP + PI: pi.clone()}

    def component_log_probs(self, state, x, prefix=MODELS):
        """log p_m(· | x) for every component: (M, batch, classes)."""
        buffers = {k: state[prefix + k] for k in self.net.buffer_keys}

        def one(params, bufs):
            return F.log_softmax(self.net.logits({**params, **bufs}, x), -1)

        return vmap(one)({k: state[prefix + k] for k in self.net.param_keys}, buffers)

    def log_likelihoods(self, state, x, y, prefix=MODELS):
        """log p_m(y | x): (M, batch)."""
        log_p = self.component_log_probs(state, x, prefix)
        return log_p.gather(-1, y.expand(log_p.shape[0], -1)[..., None])[..., 0]

    def responsibilities(self, pi, log_py):
        return torch.softmax(torch.log(pi.clamp(min=1e-12))[:, None] + log_py, 0)

    def statistics(self, state, server, x, y, w):
        q = self.responsibilities(state[PI], self.log_likelihoods(state, x, y))
        return {"q": (q * w).sum(1)}

    def begin_local(self, client, server, stats, at):
        pi = stats["q"] / at.samples.clamp(min=1)  # E-step
        frozen = {
            ESTEP + k: client[k].clone() for k in client if k.startswith(MODELS)
        }  # the E-step's components, through the M-step
        return {PI: pi, **frozen, ESTEP + PI: client[PI].clone()}

    def phases(self):
        return [self.sgd((MODELS,))]

    def loss(self, state, server, x, y):
        with torch.no_grad():
            # the E-step's q
            q = self.responsibilities(state[ESTEP + PI], self.log_likelihoods(state, x, y, ESTEP + MODELS))
        return -(q * self.log_likelihoods(state, x, y)).sum(0).mean()  # M-step: responsibility-weighted cross-entropy

    def logits(self, state, server, x):
        tuned_uniform = self.hp.ft_epochs != 0 and self.hp.ft_mix == "uniform"
        pi = torch.full_like(state[PI], 1.0 / self.hp.m) if tuned_uniform else state[PI]
        return torch.logsumexp(torch.log(pi.clamp(min=1e-12))[:, None, None] + self.component_log_probs(state, x), 0)

    def eval_phases(self):
        return [] if self.hp.ft_epochs == 0 else [self.sgd((MODELS,), self.hp.ft_epochs)]


# FedPAC's Table 1
VARIANTS = [
    variant(FedEM, "FedEM-M3", m=3),
    variant(FedEM, "FedEM-M5", m=5),
    variant(FedEM, "FedEM-FT-M3", m=3, ft_epochs=None),
    variant(FedEM, "FedEM-FT-M5", m=5, ft_epochs=None),
]
