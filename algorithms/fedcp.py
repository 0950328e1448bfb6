"""FedCP (Zhang et al., KDD 2023): a per-sample policy splits features between a global and a personal head.

Client i holds: personal extractor W_i^fe ("body."), personal head W_i^hd ("head."), CPN Θ_i
("cpn."), and its client-specific vector v_i ("fedcp.v"). Frozen during local training: the
global extractor W^fe and global head W^hd, as received (the server's "body." and "head.").
Each round (Algorithm 1): W_i^fe ← W^fe, Θ_i ← Θ; before local training v_i = Σ_c w_c, the column
sums of W_i^hd, held constant and reused at inference.
Policy (eqs. 3-4): C_i = (v_i/‖v_i‖)⊙h_i into CPN = Linear(K, 2K) → LayerNorm → ReLU, read as K x 2,
softmax over each pair: r_i + s_i = 1 elementwise.
Output (§3.2.2): g(r⊙h; W^hd) + g(s⊙h; W_i^hd).
Local loss (eq. 8): CE(output, y) + λ·MMD(h_i, f(x; W^fe)), RBF kernel.
Upload: W_i^fe, (W^hd + W_i^hd)/2 (eq. 6), Θ_i. Server: sample-weighted means (lines 18-21).
Prediction: the personalized model {W_i^fe, W^hd, W_i^hd, Θ_i}.

Ablations (Table 1): cs=False drops the client-specific vector (C_i = h_i), ss=False the
sample-specific one (C_i = v_i/‖v_i‖), both: a random frozen vector; gfm=False drops the frozen
global extractor and MMD; cpn=False feeds h to both heads; cpn=False, gh=False keeps only the
personal head. With gfm=False too, a shared extractor and a personal head are left: FedPer, the same
rounds on the same seed (tests/test_fedcp.py).

`fedcp-gumbel` is PFLlib's form (clientcp.py): the policy by Gumbel-softmax (τ = 1), also at inference.
Its noise is keyed (algorithms/common.py `gumbel`, from the engine's per-step key), not drawn from
torch's global stream as PFLlib's F.gumbel_softmax does: the same distribution, the same numbers on
every device and executor. Runs of it before 2026-11-25 drew other (equally distributed) noise; before
2026-11-29 a float32 uniform draw could round up to 1.0 (its Gumbel draw infinite, the loss nan), which stopped
every run of the digits comparison on seed 3 in round 24 (algorithms/common.py `unit_interval`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from algorithms.base import Method, Unsupported
from algorithms.common import DRAW_KEY, gumbel, mmd, prefixed, substate
from algorithms.variants import variant


@dataclass
class FedCPHparams:
    lam: float = 5.0  # λ, weight of the MMD alignment (5 for the CNN, 1 for ResNet-18 and fastText)
    cs: bool = True  # client-specific vector v_i in the CPN input
    ss: bool = True  # sample-specific vector h_i in the CPN input
    gfm: bool = True  # frozen global feature extractor with the MMD loss
    cpn: bool = True  # conditional policy network
    gh: bool = True  # frozen global head (only removable together with the CPN)

    def __post_init__(self):
        if self.cpn and not self.gh:
            raise Unsupported("FedCP cannot keep the CPN without the frozen global head (gh=false needs cpn=false).")


class FedCP(Method):
    name = "fedcp"
    title = "FedCP"
    origin = "paper"
    paper = "Zhang et al., KDD 2023"
    source = "the paper"
    Hparams = FedCPHparams
    shared = ("body.", "head.", "cpn.")

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        k = net.feature_dim
        device = next(net.module.parameters()).device
        self.policy_net = nn.Sequential(nn.Linear(k, 2 * k), nn.LayerNorm(2 * k), nn.ReLU()).to(device)
        # the CPN input when both vectors are ablated (drawn on the CPU: the same on every device)
        self.random_input = torch.randn(k).to(device)
        # v_i reduces the head's first weight matrix (C x K, or the first layer of an MLP head) over its rows
        shapes = dict(net.module.named_parameters())
        self.head_weight = next(k for k in net.keys(("head.",)) if shapes[k].dim() == 2)

    def init_client(self, model):
        state = {**super().init_client(model), **prefixed(self.policy_net, "cpn.")}
        state["fedcp.v"] = torch.ones(self.net.feature_dim)
        return {k: v.to(self.random_input.device) for k, v in state.items()}

    def broadcast(self, client, server, at):
        # W_i^fe ← W^fe and Θ_i ← Θ; the personal head stays, W^hd is read from the server when needed.
        return {**client, **{k: v for k, v in server.items() if self._shared_each_round(k)}}

    def _shared_each_round(self, key):
        """W^fe and Θ travel whole each round; BatchNorm statistics stay with their client."""
        return self.is_shared(key) and key.startswith(("body.", "cpn."))

    def begin_local(self, client, server, stats, at):
        return {"fedcp.v": client[self.head_weight].sum(0)}  # v_i = Σ_c w_c, constant during training

    def phases(self):
        return [self.sgd(("body.", "head.", "cpn."))]

    def _policy(self, state, h):
        v = state["fedcp.v"]
        if self.hp.cs and self.hp.ss:
            condition = v / torch.linalg.vector_norm(v) * h
        elif self.hp.ss:
            condition = h
        elif self.hp.cs:
            condition = (v / torch.linalg.vector_norm(v)).expand_as(h)
        else:
            condition = self.random_input.to(h.dtype).expand_as(h)
        a = functional_call(self.policy_net, substate(state, "cpn."), (condition,)).view(*h.shape, 2)
        policy = self._pairwise(a, state)
        return policy[..., 0], policy[..., 1]  # r_i, s_i

    def _pairwise(self, a, state):
        return torch.softmax(a, dim=-1)  # eq. 4

    def _frozen(self, state, server):
        """The frozen global model: the server's parameters; BatchNorm statistics on throwaway copies of the
        client's."""
        return {**{k: state[k].clone() for k in self.net.buffer_keys}, **server}

    def _output(self, state, server, h):
        if not self.hp.cpn:
            personal = self.net.head(state, h)
            return personal + self.net.head(self._frozen(state, server), h) if self.hp.gh else personal
        r, s = self._policy(state, h)
        # frozen global head + personal head
        return self.net.head(self._frozen(state, server), r * h) + self.net.head(state, s * h)

    def logits(self, state, server, x):
        return self._output(state, server, self.net.features(state, x))

    def loss(self, state, server, x, y):
        h = self.net.features(state, x)
        loss = F.cross_entropy(self._output(state, server, h), y)
        if self.hp.gfm:
            # eq. 7: the frozen extractor
            loss = loss + self.hp.lam * mmd(h, self.net.features(self._frozen(state, server), x).detach())
        return loss

    def upload(self, client, server):
        out = {k: v for k, v in client.items() if self._shared_each_round(k)}
        if self.hp.gh:  # eq. 6: the upload head is the mean of the frozen global and the personal head
            out |= {k: (server[k] + client[k]) / 2 for k in self.net.keys(("head.",))}
        return out


class FedCPGumbel(FedCP):
    """PFLlib's form of FedCP (module docstring)."""

    name = "fedcp-gumbel"
    title = "FedCP-Gumbel"
    paper = "Zhang et al., KDD 2023"
    source = "PFLlib clientcp.py"
    family = "fedcp"
    draws = True  # fresh Gumbel noise every step and every evaluated batch

    def _pairwise(self, a, state):
        return torch.softmax(a + gumbel(state[DRAW_KEY], a.shape, a.dtype), dim=-1)  # F.gumbel_softmax, τ = 1, soft


# Table 1
VARIANTS = [
    variant(FedCP, "FedCP-noCS", cs=False),
    variant(FedCP, "FedCP-noSS", ss=False),
    variant(FedCP, "FedCP-noCS-noSS", cs=False, ss=False),
    variant(FedCP, "FedCP-noGFM", gfm=False),
    variant(FedCP, "FedCP-noCPN", cpn=False),
    variant(FedCP, "FedCP-noCPN-noGFM", cpn=False, gfm=False),
    variant(FedCP, "FedCP-noCPN-noGH", cpn=False, gh=False),
    variant(FedCP, "FedCP-noCPN-noGFM-noGH", cpn=False, gfm=False, gh=False),
]
