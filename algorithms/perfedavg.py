"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020): FedAvg of a MAML objective.

Shared: the whole model w. Personal: nothing kept between rounds.
Local step (Algorithm 1), on a draw of 2B samples split into two batches D, D' of B:
  w̃ = w − α ∇f_i(w; D);  w ← w − β ∇f_i(w̃; D')            (first order, FO)
or with second_order, the exact MAML gradient (I − α ∇²f_i(w; D)) ∇f_i(w̃; D'), which
Per-FedAvg (HF) approximates with a Hessian-vector product on a third batch.
Both are one SGD step of size β on f_i(w − α g(w); D'), g detached (FO) or differentiated.
Upload: w. Server: sample-weighted mean.
Prediction: w after one step of size α on one training batch (the personalised model).

As PFLlib (clientperavg/serverperavg, which produced the GPFL and FedCP tables, the only
tables with Per-FedAvg): α is the run's lr and β equals it unless set; each step draws 2B
samples (the last partial draw dropped); the server calls each client's training twice a
round, so a round runs 2 × local_epochs epochs; before evaluating, PFLlib personalises with one
step on a batch of the client's training data (clientperavg.train_one_step), as here. Until
3 February 2023 (PFLlib f8e3a80) that step used a batch of the client's *test* data, so runs
made before then (FedCP's tables, perhaps) read test labels; this module never does.
"""

from dataclasses import dataclass

import torch.nn.functional as F
from torch.func import grad

from algorithms.base import Method
from algorithms.common import cross_entropy


@dataclass
class PerFedAvgHparams:
    beta: float | None = None  # β, the outer (meta) step size; None: the run's lr, as PFLlib sets it
    second_order: bool = False  # the exact MAML gradient instead of the first-order one


class PerFedAvg(Method):
    name = "per-fedavg"
    title = "Per-FedAvg"
    origin = "baseline"
    paper = "Fallah et al., NeurIPS 2020"
    source = "PFLlib clientperavg.py"
    Hparams = PerFedAvgHparams

    def phases(self):
        t = self.training
        beta = t.lr if self.hp.beta is None else self.hp.beta
        return [self.sgd(("body.", "head."), epochs=2 * t.local_epochs, lr=beta, batch=2 * t.batch_size)]

    def loss(self, state, server, x, y):
        half = x.shape[0] // 2
        params = {k: state[k] for k in self.net.param_keys}
        buffers = {k: state[k] for k in self.net.buffer_keys}  # inputs, not captured: BatchNorm updates them in place

        def inner_loss(p, b):
            return F.cross_entropy(self.net.logits({**state, **b, **p}, x[:half]), y[:half])

        g = grad(inner_loss)(params, buffers)
        if not self.hp.second_order:
            g = {k: v.detach() for k, v in g.items()}
        adapted = {k: params[k] - self.training.lr * g[k] for k in params}
        return F.cross_entropy(self.net.logits({**state, **adapted}, x[half:]), y[half:])

    def eval_phases(self):
        return [self.sgd(("body.", "head."), epochs=1, loss=cross_entropy(self.net), steps=1)]
