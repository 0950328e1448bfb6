"""Ditto (Li, Hu, Beirami & Smith, ICML 2021): a global model trained as in FedAvg, and a personal
model pulled towards it.

Shared: the global model w ("global.body.", "global.head."). Personal: v_i ("body.", "head.").
Local round (Algorithm 1): the local epochs of w on cross-entropy (FedAvg's update), then as
many epochs of v_i on F_i(v_i) + λ/2 ‖v_i − w^t‖² (eq. 2), w^t the global model received this
round. The original (litian96/ditto, trainers_MTL/ditto.py) takes one step of each model per
minibatch for the same `local_iters`; v_i's steps read only w^t, so running them after w's is
the same update. `personal_epochs` sets v_i's epochs apart (PFLlib's -pls, default 1).
Upload: w. Server: sample-weighted mean. Prediction: v_i.
"""

from dataclasses import dataclass

import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import cross_entropy

GLOBAL = "global."


@dataclass
class DittoHparams:
    lam: float = 1.0  # λ, pull of the personal model to the global one (FedPAC's tuned value)
    personal_epochs: int | None = None  # epochs of v_i per round; None: the run's local epochs, as w's


class Ditto(Method):
    name = "ditto"
    title = "Ditto"
    origin = "baseline"
    paper = "Li et al., ICML 2021"
    source = "litian96/ditto"
    Hparams = DittoHparams
    shared = (GLOBAL,)

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, GLOBAL)}

    def phases(self):
        return [
            self.sgd((GLOBAL,), loss=cross_entropy(self.net, GLOBAL)),
            self.sgd(("body.", "head."), self.hp.personal_epochs),
        ]

    def loss(self, state, server, x, y):
        pull = sum(((state[k] - server[GLOBAL + k]) ** 2).sum() for k in self.net.param_keys)
        return F.cross_entropy(self.net.logits(state, x), y) + self.hp.lam / 2 * pull  # eq. 2
