"""HypCluster (Mansour et al., 2020): k cluster models; each client takes the one that fits it best.

Server: k models ("hyp.model.", stacked), from k random initialisations. Client: the cluster it
chose ("hyp.choice", one-hot) and its copy of that model ("body.", "head.").
Local round: the loss of every cluster model on the client's training data (one pass); the client
takes the model of lowest loss, then trains it with cross-entropy.
Upload: the trained model and the choice. Server: each cluster model becomes the sample-weighted
mean of the clients that chose it (a cluster nobody chose keeps its model).
Prediction: the model of the client's cluster (its own model until it has chosen one).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import vmap

from algorithms.base import Method
from algorithms.common import substate
from algorithms.variants import variant

MODELS, CHOICE = "hyp.model.", "hyp.choice"


@dataclass
class HypClusterHparams:
    k: int = 3  # number of cluster models


class HypCluster(Method):
    name = "hypcluster"
    title = "HypCluster"
    origin = "baseline"
    paper = "Mansour et al., 2020"
    source = "the paper, as FedPAC's baseline"
    Hparams = HypClusterHparams
    shared = ()

    def init_client(self, model):
        choice = torch.zeros(self.hp.k, device=model[self.net.param_keys[0]].device)
        return {**super().init_client(model), CHOICE: choice}

    def init_server(self, model):
        models = [model] + [self.net.fresh(seed) for seed in range(1, self.hp.k)]
        return {k: v.to(model[self.net.param_keys[0]].device) for k, v in self.net.stacked(models, MODELS).items()}

    def statistics(self, state, server, x, y, w):
        def loss_of(model):
            return (F.cross_entropy(self.net.logits({**state, **model}, x), y, reduction="none") * w).sum()

        return {"loss": vmap(loss_of)(substate(server, MODELS))}

    def begin_local(self, client, server, stats, at):
        best = stats["loss"].argmin()
        chosen = {k: server[MODELS + k][best] for k in self.net.param_keys + self.net.buffer_keys}
        choice = F.one_hot(best, self.hp.k).to(client[CHOICE].dtype)
        return {**chosen, CHOICE: choice}

    def upload(self, client, server):
        return {**{k: client[k] for k in self.net.param_keys}, CHOICE: client[CHOICE]}

    def aggregate(self, server, uploads, at):
        share = uploads[CHOICE] * at.samples[:, None]  # (cohort, k)
        total = share.sum(0)
        out = dict(server)
        for key in self.net.param_keys:
            mean = torch.tensordot((share / total.clamp(min=1e-12)).T, uploads[key], dims=1)  # (k, ...)
            picked = (total > 0).view(-1, *[1] * (mean.dim() - 1))
            out[MODELS + key] = torch.where(picked, mean, server[MODELS + key])
        return out

    def logits(self, state, server, x):
        chosen = state[CHOICE].sum()  # 1 once the client has chosen, 0 before
        model = {
            k: torch.tensordot(state[CHOICE], server[MODELS + k], dims=1) + (1 - chosen) * state[k]
            for k in self.net.param_keys
        }
        return self.net.logits({**state, **model}, x)


# FedPAC's Table 1
VARIANTS = [variant(HypCluster, "HypCluster-k3", k=3), variant(HypCluster, "HypCluster-k5", k=5)]
