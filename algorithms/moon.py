"""MOON (Li, He & Song, CVPR 2021): model-contrastive learning of the representation.

Shared: the whole backbone. Personal: the client's previous local model ("moon.prev."), at first the
initial model.
Local loss (eqs. 2-3): CE + μ · ℓ_con, ℓ_con = −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z,
z_prev)/τ}) ),
z, z_glob, z_prev the representations of x under the local model being trained, the received global
model and the client's previous local model (both frozen), sim the cosine similarity.
After training: the previous model ← the model just trained. Upload / server / prediction: as FedAvg.

Sources: the paper; PFLlib clientmoon.py, whose form this is: the representation is the backbone's
feature output (the paper's models add a two-layer projection head for z, which the official
QinbinLi/MOON code also feeds to the classifier; our backbones have none, as PFLlib's). τ = 0.5 and
μ = 1 are the paper's (μ = 5 on CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet; grid 0.1, 1, 5, 10).

With batch norm: PFLlib never sets the frozen models' mode (no `.eval()`, unlike its FedNTD), so they
normalize with the batch's statistics in training, as here. Their running statistics are their own: the
previous model's here too ("moon.prev." holds its buffers, replaced after training as PFLlib's deep copy);
the global model's are the server model's in PFLlib (the first uploader's, moved by every client's
forward), here a copy of the client's that each step discards, so the client's own statistics move with
its local model only.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method

PREVIOUS = "moon.prev."


@dataclass
class MOONHparams:
    mu: float = 1.0  # μ, weight of the model-contrastive loss
    tau: float = 0.5  # τ, the temperature


class MOON(Method):
    name = "moon"
    title = "MOON"
    origin = "roster"
    paper = "Li et al., CVPR 2021"
    source = "PFLlib clientmoon.py"
    Hparams = MOONHparams

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, PREVIOUS)}

    def loss(self, state, server, x, y):
        z = self.net.features(state, x)
        statistics = {
            k: state[k].clone() for k in self.net.buffer_keys
        }  # the global model's forward moves these, not the client's
        z_global = self.net.features({**state, **server, **statistics}, x).detach()  # frozen
        z_previous = self.net.features(state, x, PREVIOUS + "body.").detach()
        agree = F.cosine_similarity(z, z_global, dim=-1) / self.hp.tau
        disagree = F.cosine_similarity(z, z_previous, dim=-1) / self.hp.tau
        contrastive = -(agree - torch.logsumexp(torch.stack([agree, disagree]), 0))  # eq. 2, as a log-softmax
        return F.cross_entropy(self.net.head(state, z), y) + self.hp.mu * contrastive.mean()  # eq. 3

    def end_local(self, client, server, stats, at):
        return {PREVIOUS + k: client[k].clone() for k in self.net.param_keys + self.net.buffer_keys}
