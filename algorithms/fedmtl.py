"""FedMTL (after MOCHA, Smith et al., NeurIPS 2017): personal models tied by a task-relationship regularizer.

Shared: nothing is averaged. Personal: every client's own model w_i. The server keeps every client's
latest model (the columns of W) and sends each client the sum S_i of the others'.
Local loss (PFLlib's regularizer of W = [w_1 … w_m] with Ω = (I − 11ᵀ/m)², read as its code does, ω = 1 − 1/m):
  CE + λ (‖W‖² + ω² ‖Σ_j w_j‖²),  in w_i:  CE + λ (‖w_i‖² + ω² ‖w_i + S_i‖²)  (+ terms without w_i),
λ = 10^−f, f = ⌊log10 D + 1⌋ + 1, D the model's size (PFLlib's scale, by default).
Upload: w_i. Server: keeps it as client i's column. Prediction: w_i.

Sources: PFLlib clientmtl.py / servermtl.py (MOCHA's primal-dual solver, for convex models, is not
what PFLlib runs). Differences: PFLlib builds W from `state_dict()` tensors, which carry no gradient, so
there the regularizer adds nothing and FedMTL trains as Local-only; here its gradient flows. PFLlib's W
holds the round's cohort at the start of the round; here every client's latest model (the same under
full participation), m the federation's size.
"""

import math
from dataclasses import dataclass

import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import per_client

MODELS, OTHERS = "mtl.models.", "mtl.others."


@dataclass
class FedMTLHparams:
    lam: float | None = None  # λ, the regularizer's weight; None: PFLlib's 10^−f from the model's size


class FedMTL(Method):
    name = "fedmtl"
    title = "FedMTL"
    origin = "roster"
    paper = "Smith et al., NeurIPS 2017 (MOCHA)"
    source = "PFLlib clientmtl.py"
    Hparams = FedMTLHparams
    shared = ()

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        size = sum(v.numel() for v in net.initial_state().values())  # PFLlib flattens the state_dict, buffers too
        self.pfllib_scale = 10.0 ** -(int(math.log10(size) + 1) + 1)

    def init_client(self, model):
        return {
            **super().init_client(model),
            **{OTHERS + k: model[k] * (self.training.clients - 1) for k in self.net.param_keys},
        }

    def init_server(self, model):
        return {MODELS + k: per_client(model[k], self.training.clients) for k in self.net.param_keys}

    def broadcast(self, client, server, at):
        return {
            **client,
            **{OTHERS + k: server[MODELS + k].sum(0) - server[MODELS + k][at.clients] for k in self.net.param_keys},
        }

    def loss(self, state, server, x, y):
        omega = 1 - 1 / self.training.clients
        own = sum((state[k] ** 2).sum() for k in self.net.param_keys)  # ‖w_i‖², its column of ‖W‖²
        together = sum(((state[k] + state[OTHERS + k]) ** 2).sum() for k in self.net.param_keys)  # ‖Σ_j w_j‖²
        lam = self.pfllib_scale if self.hp.lam is None else self.hp.lam
        return F.cross_entropy(self.net.logits(state, x), y) + lam * (own + omega**2 * together)

    def upload(self, client, server):
        return {k: client[k] for k in self.net.param_keys}

    def aggregate(self, server, uploads, at):
        return {
            **server,
            **{MODELS + k: server[MODELS + k].index_put((at.clients,), uploads[k]) for k in self.net.param_keys},
        }
