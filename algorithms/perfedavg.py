"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020): FedAvg of a MAML objective.

Shared: the whole model w. Personal: nothing kept between rounds.
Local step (Algorithm 1) on a minibatch split in halves D, D':
  w̃ = w − α ∇f_i(w; D);  w ← w − β ∇f_i(w̃; D')            (first order, FO)
or with second_order, the exact MAML gradient (I − α ∇²f_i(w; D)) ∇f_i(w̃; D'), which
Per-FedAvg (HF) approximates with a Hessian-vector product on a third batch.
Both are one SGD step of size β on f_i(w − α g(w); D'), g detached (FO) or differentiated.
α is the run's lr, β the `beta` hyperparameter (PFLlib's convention).
Upload: w. Server: sample-weighted mean.
Prediction: w after one step of size α on one training batch (the personalised model).
"""

from dataclasses import dataclass

import torch.nn.functional as F
from torch.func import grad

from algorithms.base import Method


@dataclass
class PerFedAvgHparams:
    beta: float = 0.001  # β, the outer (meta) step size (PFLlib's default)
    second_order: bool = False  # the exact MAML gradient instead of the first-order one


class PerFedAvg(Method):
    name = "per-fedavg"
    title = "Per-FedAvg"
    Hparams = PerFedAvgHparams

    def phases(self):
        return [self.sgd(("body.", "head."), lr=self.hp.beta)]

    def loss(self, state, server, x, y):
        half = x.shape[0] // 2
        params = {k: state[k] for k in self.net.param_keys}
        buffers = {k: state[k] for k in self.net.buffer_keys}  # inputs, not captured: BatchNorm updates them in place
        inner_loss = lambda p, b: F.cross_entropy(self.net.logits({**state, **b, **p}, x[:half]), y[:half])  # noqa: E731
        g = grad(inner_loss)(params, buffers)
        if not self.hp.second_order:
            g = {k: v.detach() for k, v in g.items()}
        adapted = {k: params[k] - self.training.lr * g[k] for k in params}
        return F.cross_entropy(self.net.logits({**state, **adapted}, x[half:]), y[half:])

    def eval_phases(self):
        return [self.sgd(("body.", "head."), epochs=1, loss=self.plain_loss, steps=1)]

    def plain_loss(self, state, server, x, y):
        return F.cross_entropy(self.net.logits(state, x), y)
