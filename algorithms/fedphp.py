"""FedPHP (Li et al., ECML-PKDD 2021): personalised models inherited across rounds, taught by the
global model — in PFLlib's form, which produced the GPFL and FedCP tables.

Shared: the whole model. Personal: the client's model ("body.", "head.") and the teacher
("php.teacher."), a copy of the global model.
Receiving (round R of T): w_i ← (1 − μ_R) w + μ_R w_i with μ_R = μ · R / T, the private
model inheriting more of itself as training goes on; the teacher becomes w.
Local loss: (1 − λ) CE(w_i) + λ · MMD(f_{w_i}(x), f_teacher(x)), RBF kernels of bandwidths
10, 15, 20, 50 (the teacher is not trained).
Upload: w_i. Server: sample-weighted mean. Prediction: w_i.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method

TEACHER = "php.teacher."
ROUND = "php.round"
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


@dataclass
class FedPHPHparams:
    mu: float = 0.9  # μ, the inheritance at the last round
    lam: float = 0.5  # λ, weight of the MMD transfer


def mmd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Maximum mean discrepancy of two batches of features under a sum of RBF kernels."""

    def kernel(u, v):
        d = (u * u).sum(1)[:, None] + (v * v).sum(1)[None] - 2 * u @ v.T
        return sum(torch.exp(-0.5 * d / h) for h in BANDWIDTHS)

    return (kernel(a, a) + kernel(b, b) - 2 * kernel(a, b)).mean()


class FedPHP(Method):
    name = "fedphp"
    title = "FedPHP"
    Hparams = FedPHPHparams

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, TEACHER)}

    def init_server(self, model, num_clients):
        return {**super().init_server(model, num_clients), ROUND: torch.zeros((), device=model[self.net.param_keys[0]].device)}

    def broadcast(self, client, server, index):
        mu = self.hp.mu * (server[ROUND] + 1) / self.training.rounds  # the round about to be trained
        keys = self.net.param_keys
        own = {k: (1 - mu) * server[k] + mu * client[k] for k in keys}
        return {**client, **own, **{TEACHER + k: server[k] for k in keys}}

    def loss(self, state, server, x, y):
        f = self.net.features(state, x)
        teacher = self.net.features(state, x, TEACHER + "body.").detach()
        return (1 - self.hp.lam) * F.cross_entropy(self.net.head(state, f), y) + self.hp.lam * mmd(f, teacher)

    def aggregate(self, server, uploads, weights, ids):
        return {**super().aggregate(server, uploads, weights, ids), ROUND: server[ROUND] + 1}
