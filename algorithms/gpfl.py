"""GPFL (Zhang et al., ICCV 2023): learn global and personalized feature information at once.

Shared: feature extractor W^fe ("body."), Conditional Valve V ("cov."), Global Category
        Embeddings C ("gce.weight", U x K). Personal: head W_i^h ("head.").
Each round the client receives W^fe, V, C; Ĉ is the frozen copy of the received C (here: the
server's C, unchanged until aggregation), g = mean_u Ĉ_u (eq. 5), p_i = Σ_u α_i^u Ĉ_u / U with
α_i the client's label frequencies (eqs. 6-7).
CoV (eqs. 3-4): f^G = ReLU((γ+1)⊙f + β) from g, f^P = ReLU((γ_i+1)⊙f + β_i) from p_i; γ and β each
come from Linear(K, K) → ReLU → LayerNorm(K) of the conditional input.
Local loss (eq. 11): CE(ψ(f^P), y) (eq. 10) + L_alg (eq. 8) + λ·L_mlg (eq. 9) + μ‖V‖₂ + μ‖C‖₂.
Upload: W^fe, V, C (never the head). Server: sample-weighted means (Algorithm 1, lines 15-17).
Prediction: the personalized route only, ψ(f^P).

Ablations (Table 6): pci=False feeds constant vectors a, b instead of p_i, g; cov=False uses f
for both routes; mlg=False drops L_mlg; gce=False drops the embeddings with both guidance
losses (the valve then gets a, b).

`gpfl-pfllib` is PFLlib's form, the code behind the published tables (clientgp.py): L_mlg as one
unsquared norm over the whole batch, μ as weight decay on V and C (μ/2‖·‖² in the loss: the same
gradient), p_i without the 1/U, and g, p_i computed from the client's own embeddings (as it last
trained them) just before the received ones overwrite them ("gpfl.cond_gce"), instead of from Ĉ. Round 1
trains on zero conditional inputs: PFLlib's client starts them at zeros (clientgpfl.py __init__) and
set_GCE first runs after round 1's aggregation (servergpfl.py train). One client step (loss and every
gradient) equals PFLlib's clientgpfl.train to rounding in float64 (tests/test_methods.py). On PFLlib's own
Fashion-MNIST Dir(0.1) folder our curve follows PFLlib's within its own spread (the figures: docs/reproduction.md,
"Against PFLlib itself"). Left as PFLlib has them: its label
frequencies α_i count a drop_last loader's samples (here every sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from algorithms.base import Method
from algorithms.common import label_counts, prefixed, substate
from algorithms.variants import variant


@dataclass
class GPFLHparams:
    lam: float = 0.01  # λ, weight of the magnitude-level guidance (official: 0.01 for the CNN)
    mu: float = 0.1  # μ, weight of the norms of V and C (official: 0.1 for the CNN)
    pci: bool = True  # personalized conditional input p_i (and g); False: constant vectors a, b
    cov: bool = True  # Conditional Valve; False: f^G = f^P = f
    mlg: bool = True  # magnitude-level guidance L_mlg
    gce: bool = True  # Global Category Embeddings with the angle- and magnitude-level guidance


class ConditionalValve(nn.Module):
    """CoV: γ and β sub-modules, each Linear → ReLU → LayerNorm of the conditional input."""

    def __init__(self, k: int):
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(k, k), nn.ReLU(), nn.LayerNorm(k))
        self.beta = nn.Sequential(nn.Linear(k, k), nn.ReLU(), nn.LayerNorm(k))

    def forward(self, f: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return F.relu((self.gamma(condition) + 1) * f + self.beta(condition))  # eq. 3


class GPFL(Method):
    name = "gpfl"
    title = "GPFL"
    origin = "paper"
    paper = "Zhang et al., ICCV 2023"
    source = "the paper"
    Hparams = GPFLHparams
    shared = ("body.", "cov.", "gce.")

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        k, u = net.feature_dim, training.num_classes
        device = next(net.module.parameters()).device
        self.valve = ConditionalValve(k).to(device)
        self.embeddings = nn.Embedding(u, k).to(device)
        # a and b of the ablations, identical across clients (drawn on the CPU: the same on every device)
        self.constants = torch.randn(2, k).to(device)

    def init_client(self, model):
        state = {
            **super().init_client(model),
            **prefixed(self.valve, "cov."),
            "gpfl.alpha": torch.zeros(self.training.num_classes),
        }
        if self.hp.gce:
            state |= prefixed(self.embeddings, "gce.")
        return {k: v.to(self.constants.device) for k, v in state.items()}

    def statistics(self, state, server, x, y, w):
        return {"labels": label_counts(y, w, self.training.num_classes)}

    def begin_local(self, client, server, stats, at):
        return {"gpfl.alpha": stats["labels"] / stats["labels"].sum().clamp(min=1)}  # eq. 6

    def phases(self):
        return [self.sgd(self.shared + ("head.",))]

    # --- the two routes
    def _conditions(self, state, server):
        """(g, p_i) from the frozen embeddings Ĉ (eqs. 5, 7), or the constants a, b of the ablations."""
        if not (self.hp.pci and self.hp.gce):
            c = self.constants.to(state["head.weight"].dtype)
            return c[1], c[0]
        frozen = server["gce.weight"]  # Ĉ
        return frozen.mean(0), state["gpfl.alpha"] @ frozen / frozen.shape[0]  # g (eq. 5), p_i (eq. 7)

    def _routes(self, state, server, x):
        f = self.net.features(state, x)
        if not self.hp.cov:
            return f, f
        g, p = self._conditions(state, server)
        valve = substate(state, "cov.")
        return functional_call(self.valve, valve, (f, g)), functional_call(self.valve, valve, (f, p))

    def logits(self, state, server, x):
        return self.net.head(state, self._routes(state, server, x)[1])  # personalized route only

    def loss(self, state, server, x, y):
        f_global, f_personal = self._routes(state, server, x)
        loss = F.cross_entropy(self.net.head(state, f_personal), y)  # eq. 10
        valve_params = list(substate(state, "cov.").values()) if self.hp.cov else []
        emb_params = []
        if self.hp.gce:
            emb = state["gce.weight"]
            cosine = F.cosine_similarity(f_global[:, None, :], emb[None, :, :], dim=-1)
            loss = loss + F.cross_entropy(cosine, y)  # eq. 8: angle-level guidance
            if self.hp.mlg:
                gap = f_global - server["gce.weight"][y]  # against the frozen Ĉ_y
                loss = loss + self.hp.lam * self._magnitude_gap(gap)  # eq. 9: magnitude-level guidance
            emb_params = [emb]
        return loss + self._norms(valve_params, emb_params)

    def _magnitude_gap(self, gap):
        return torch.linalg.vector_norm(gap, dim=1).mean()  # eq. 9: per sample, averaged

    def _norms(self, valve_params, emb_params):
        """μ‖V‖₂ + μ‖C‖₂ (eq. 11)."""
        return sum(
            self.hp.mu * torch.sqrt(sum((p**2).sum() for p in params))
            for params in (valve_params, emb_params)
            if params
        )


class GPFLPfllib(GPFL):
    """PFLlib's form of GPFL (module docstring)."""

    name = "gpfl-pfllib"
    title = "GPFL-PFLlib"
    paper = "Zhang et al., ICCV 2023"
    source = "PFLlib clientgpfl.py"
    family = "gpfl"

    def init_client(self, model):
        state = super().init_client(model)
        return state | ({"gpfl.cond_gce": torch.zeros_like(state["gce.weight"])} if self.hp.gce else {})

    def broadcast(self, client, server, at):
        out = super().broadcast(client, server, at)
        # set_GCE: the conditions come from the client's embeddings about to be replaced
        if self.hp.gce and at.number > 1:
            out["gpfl.cond_gce"] = client["gce.weight"]
        return out

    def _conditions(self, state, server):
        if not (self.hp.pci and self.hp.gce):
            return super()._conditions(state, server)
        own = state["gpfl.cond_gce"]
        return own.mean(0), state["gpfl.alpha"] @ own  # no 1/U

    def _magnitude_gap(self, gap):
        return torch.linalg.vector_norm(gap)  # one norm over the batch

    def _norms(self, valve_params, emb_params):
        return self.hp.mu / 2 * sum((p**2).sum() for p in valve_params + emb_params)  # μ as weight decay


# Table 6
VARIANTS = [
    variant(GPFL, "GPFL-noPCI", pci=False),
    variant(GPFL, "GPFL-noCoV", cov=False),
    variant(GPFL, "GPFL-noMLG", mlg=False),
    variant(GPFL, "GPFL-noGCE", gce=False),
]
