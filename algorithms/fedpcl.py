"""FedPCL (Tan et al., NeurIPS 2022), without pre-trained backbones: federated prototype-wise contrastive learning.

Shared: class prototypes, no weights. Personal: the whole backbone; the head is not used (the body's
normalized features are the representation).
Prototypes: a client's class means of its normalized features (its local prototypes); the server's
global prototypes G_c, the plain mean over the cohort's clients that hold c; and every client's last
local prototypes P_j kept on the server, a class it lacks filled with G_c.
Local loss (the paper's two supervised contrastive terms, as PFLlib writes them):
  CE(z·Gᵀ/τ, y) + (1/N) Σ_j CE(z·P_jᵀ/τ, y),  z the normalized features, over every client j;
each step's gradient clipped at norm 10. A round with no prototypes yet (the first) trains nothing.
Upload: the client's per-class sums and counts of z after training.
Prediction: the class of the largest z·P_i,c, the client's own prototypes (G_c for a class it lacks).

Sources: PFLlib clientpcl.py / serverpcl.py (τ = 1, its default; clipping at 10). Differences: PFLlib
stacks the prototypes in the order their classes first appear in a shuffled loader, so the row a label
indexes is often another class's; here row c is class c. PFLlib's G holds the current cohort's classes
only (a class missing from a round fails its assertion); here a class keeps its last global prototype.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import class_sums

SUM, COUNT = "pcl.sum", "pcl.count"
GLOBAL, HAS = "pcl.global", "pcl.has"  # G (C, K) and which classes it holds
CLIENTS, FILLED = "pcl.clients", "pcl.filled"  # every client's P_j (N, C, K) and which rows hold a prototype
OWN = "pcl.own"  # the client's own P_i, for prediction


@dataclass
class FedPCLHparams:
    tau: float = 1.0  # τ, the contrastive temperature (PFLlib's default)


class FedPCL(Method):
    name = "fedpcl"
    title = "FedPCL"
    origin = "roster"
    paper = "Tan et al., NeurIPS 2022"
    source = "PFLlib clientpcl.py"
    Hparams = FedPCLHparams
    shared = ()

    def _zeros(self, model, *shape):
        return torch.zeros(*shape, device=model[self.net.param_keys[0]].device)

    def init_client(self, model):
        c, k = self.training.num_classes, self.net.feature_dim
        return {
            **super().init_client(model),
            SUM: self._zeros(model, c, k),
            COUNT: self._zeros(model, c),
            OWN: self._zeros(model, c, k),
        }

    def init_server(self, model):
        n, c, k = self.training.clients, self.training.num_classes, self.net.feature_dim
        return {
            GLOBAL: self._zeros(model, c, k),
            HAS: self._zeros(model, c),
            CLIENTS: self._zeros(model, n, c, k),
            FILLED: self._zeros(model, n, c),
        }

    def phases(self):
        return [self.sgd(("body.",), clip=10.0)]

    def _z(self, state, x):
        return F.normalize(self.net.features(state, x), dim=1)

    def loss(self, state, server, x, y):
        z, has = self._z(state, x), server[HAS]
        # a class without a prototype anywhere is left out of the softmax (finite: no NaN gradient)
        absent = -1e9 * (1 - has)
        weight = has[y]  # ... and a sample of such a class adds nothing; before any prototype, nothing trains

        def contrast(protos):  # CE(z·Pᵀ/τ, y), per sample
            return F.cross_entropy(z @ protos.T / self.hp.tau + absent, y, reduction="none")

        per_client = torch.stack([contrast(p) for p in server[CLIENTS].unbind(0)]).mean(0)
        terms = torch.where(weight > 0, contrast(server[GLOBAL]) + per_client, 0.0)
        return (terms * weight).mean()

    def statistics(self, state, server, x, y, w):
        return class_sums(self._z(state, x), y, w, self.training.num_classes)

    def end_local(self, client, server, stats, at):
        return {SUM: stats["sum"], COUNT: stats["count"]}

    def upload(self, client, server):
        return {SUM: client[SUM], COUNT: client[COUNT]}

    def aggregate(self, server, uploads, at):
        holds = (uploads[COUNT] > 0).to(uploads[SUM].dtype)  # (cohort, C)
        local = uploads[SUM] / uploads[COUNT].clamp(min=1)[..., None]
        clients = holds.sum(0)
        fresh = clients > 0
        glob = torch.where(
            fresh[:, None], (local * holds[..., None]).sum(0) / clients.clamp(min=1)[:, None], server[GLOBAL]
        )
        has = torch.maximum(server[HAS], fresh.to(clients.dtype))
        protos, filled = server[CLIENTS].clone(), server[FILLED].clone()
        protos[at.clients], filled[at.clients] = local, holds  # the cohort's prototypes replace their last ones
        pad = (filled == 0) & (has > 0)  # a class a client lacks takes the global prototype (once: it stays)
        protos = torch.where(pad[..., None], glob.expand_as(protos), protos)
        filled = torch.maximum(filled, pad.to(filled.dtype))
        return {GLOBAL: glob, HAS: has, CLIENTS: protos, FILLED: filled}

    def broadcast(self, client, server, at):
        return {**client, OWN: server[CLIENTS][at.clients]}

    def logits(self, state, server, x):
        # a class without a prototype is never predicted
        return self._z(state, x) @ state[OWN].T - 1e9 * (1 - server[HAS])
