"""FedAMP (Huang et al., AAAI 2021): attentive message passing between similar clients.

Shared: nothing directly. Personal: each client's model w_i ("body.", "head.") and its cloud
model u_i ("amp.u."), which the server computes for it.
Server (eqs. 5-6, PFLlib's form): for client i of the cohort,
u_i = Σ_{j≠i} ξ_ij w_j + (1 − Σ_{j≠i} ξ_ij) w_i with ξ_ij = α_K · e^{−‖w_i − w_j‖²/σ} / σ,
over the models uploaded this round; it is kept for client i and sent to it next time.
Local loss (eq. 7): CE + λ / (2 α_K) · ‖w_i − u_i‖² (PFLlib applies it to detached tensors,
so there it adds no gradient; here it pulls, as the paper states).
Upload: w_i. Prediction: w_i.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import per_client

CLOUD = "amp.u."


@dataclass
class FedAMPHparams:
    alpha_k: float = 1.0  # α_K, step of the attention (PFLlib's default)
    lam: float = 1.0  # λ, pull to the cloud model (PFLlib's default)
    sigma: float = 1.0  # σ, bandwidth of the similarity (PFLlib's default)


class FedAMP(Method):
    name = "fedamp"
    title = "FedAMP"
    origin = "baseline"
    paper = "Huang et al., AAAI 2021"
    source = "the paper; PFLlib clientamp.py"
    Hparams = FedAMPHparams
    shared = ()

    def init_client(self, model):
        return {**super().init_client(model), **{CLOUD + k: model[k].clone() for k in self.net.param_keys}}

    def init_server(self, model):
        return {CLOUD + k: per_client(model[k], self.training.clients) for k in self.net.param_keys}

    def broadcast(self, client, server, at):
        return {**client, **{CLOUD + k: server[CLOUD + k][at.clients] for k in self.net.param_keys}}

    def loss(self, state, server, x, y):
        pull = sum(((state[k] - state[CLOUD + k]) ** 2).sum() for k in self.net.param_keys)
        return F.cross_entropy(self.net.logits(state, x), y) + self.hp.lam / (2 * self.hp.alpha_k) * pull  # eq. 7

    def upload(self, client, server):
        return {k: client[k] for k in self.net.param_keys}

    def aggregate(self, server, uploads, at):
        flat = torch.cat([uploads[k].flatten(1) for k in self.net.param_keys], 1)
        # exact: the matrix-product path (used past 25 rows) loses small distances
        distance = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist") ** 2
        xi = self.hp.alpha_k * torch.exp(-distance / self.hp.sigma) / self.hp.sigma
        xi = xi * (1 - torch.eye(len(at.clients), device=xi.device))
        xi = xi + torch.diag(1 - xi.sum(1))  # eq. 6: the rest of the weight stays with the client's own model
        out = dict(server)
        for k in self.net.param_keys:
            out[CLOUD + k] = server[CLOUD + k].index_put((at.clients,), torch.tensordot(xi, uploads[k], dims=1))
        return out
