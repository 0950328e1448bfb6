"""FedGC (Niu & Deng, AAAI 2022): federated learning with gradient correction of the class embeddings (face
recognition's
softmax over each client's own classes, the missing negatives supplied on the server).

Shared: the body (FedAvg). Personal: a bias-free head over the client's own classes ("gc.head", rows of
other classes unused); the server keeps every client's head.
Local loss: CE of f(x)·Wᵀ over the client's own classes.
Upload: body, head and which classes the client holds. Server: the bodies' sample-weighted mean; then one
SGD step (lr = the run's lr × λ) on every known client's head of the regularizer
  Σ_c n_c · −log( e^{e_c·e_c} / (e^{e_c·e_c} + Σ_{j without c} Σ_{r ∈ classes(j)} e^{W_j,r·e_c}) ),
e_c the mean of the heads' rows for class c (no gradient), n_c its holders: the heads of the clients
without c are pushed away from e_c; the clients take their heads back next round.
Prediction: the body and the client's head, over its own classes.

Sources: PFLlib clientgc.py / servergc.py (λ = 1, its default). Differences: every client's head starts
from one bias-free head drawn at start (PFLlib draws a head of its own class count per client); the server's
regularizer covers the clients it has heard from (PFLlib's, every client from the start: the same from
round 2 under full participation), computed as a softplus of a log-sum-exp (the same value, without
overflow); a test sample of a class the client lacks counts as wrong (PFLlib maps it to the client's first
class, so a prediction of that class counts as right).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad

from algorithms.base import Method
from algorithms.common import label_counts, per_client, weighted_mean

HEAD, HOLDS = "gc.head", "gc.holds"
HEADS, KNOWN = "gc.heads", "gc.known"  # the server's copy of every client's head and classes


@dataclass
class FedGCHparams:
    lam: float = 1.0  # λ: the server's step on the heads is the run's lr × λ (PFLlib's default)


class FedGC(Method):
    name = "fedgc"
    title = "FedGC"
    origin = "roster"
    paper = "Niu & Deng, AAAI 2022"
    source = "PFLlib clientgc.py"
    Hparams = FedGCHparams
    shared = ("body.",)

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        device = next(net.module.parameters()).device
        # drawn with the backbone, under the run's seed
        self.head = nn.Linear(net.feature_dim, training.num_classes, bias=False).to(device)

    def init_client(self, model):
        head = self.head.weight.detach().clone()
        return {
            **super().init_client(model),
            HEAD: head,
            HOLDS: torch.zeros(head.shape[0], dtype=head.dtype, device=head.device),
        }

    def init_server(self, model):
        head = self.head.weight.detach()
        n = self.training.clients
        return {
            **super().init_server(model),
            HEADS: per_client(head, n),
            KNOWN: torch.zeros(n, head.shape[0], dtype=head.dtype, device=head.device),
        }

    def statistics(self, state, server, x, y, w):
        return {"labels": label_counts(y, w, self.training.num_classes)}

    def begin_local(self, client, server, stats, at):
        return {HOLDS: (stats["labels"] > 0).to(client[HEAD].dtype)}

    def phases(self):
        return [self.sgd(("body.", HEAD))]

    def logits(self, state, server, x):
        return self.net.features(state, x) @ state[HEAD].T - 1e9 * (1 - state[HOLDS])  # its own classes only

    def loss(self, state, server, x, y):
        return F.cross_entropy(self.logits(state, server, x), y)

    def upload(self, client, server):
        return {**super().upload(client, server), HEAD: client[HEAD], HOLDS: client[HOLDS]}

    def aggregate(self, server, uploads, at):
        body = weighted_mean({k: v for k, v in uploads.items() if k.startswith("body.")}, at.samples)
        heads = server[HEADS].index_put((at.clients,), uploads[HEAD])
        known = server[KNOWN].index_put((at.clients,), uploads[HOLDS])
        holders = known.sum(0)
        centres = ((known[..., None] * heads).sum(0) / holders.clamp(min=1)[:, None]).detach()  # e_c

        def regularizer(heads):
            scores = torch.einsum("jrk,ck->cjr", heads, centres)  # W_j,r · e_c
            outside = (1 - known.T)[:, :, None] * known[None, :, :]  # j lacks c, r is one of j's classes
            negatives = torch.logsumexp(scores.masked_fill(outside == 0, -torch.inf).flatten(1), 1)
            own = (centres**2).sum(1)
            per_class = F.softplus(negatives - own)  # −log(e^own / (e^own + Σ e^negatives))
            return (holders * torch.where(holders > 0, per_class, 0.0)).sum()

        heads = heads - self.training.lr * self.hp.lam * grad(regularizer)(heads)
        return {**server, **body, HEADS: heads, KNOWN: known}

    def broadcast(self, client, server, at):
        out = super().broadcast(client, server, at)
        heard = server[KNOWN][at.clients].sum() > 0
        return {**out, HEAD: torch.where(heard, server[HEADS][at.clients], client[HEAD])}
