"""FedProx (Li et al., 2020): FedAvg with a proximal term.

Shared: the whole backbone. Personal: nothing.
Local loss: CE + mu/2 * ||w - w_global||^2, w_global the model received this round.
Upload / server / prediction: as FedAvg.
"""

from dataclasses import dataclass

import torch.nn.functional as F

from algorithms.base import Method


@dataclass
class FedProxHparams:
    mu: float = 0.01  # weight of the proximal term


class FedProx(Method):
    name = "fedprox"
    title = "FedProx"
    origin = "baseline"
    paper = "Li et al., MLSys 2020"
    source = "PFLlib clientprox.py"
    Hparams = FedProxHparams

    def loss(self, state, server, x, y):
        proximal = sum(((state[k] - server[k]) ** 2).sum() for k in server)
        return F.cross_entropy(self.net.logits(state, x), y) + self.hp.mu / 2 * proximal
