"""FedDBE (Zhang et al., NeurIPS 2023): eliminating domain bias, a personal feature bias and a mean regularizer.

Shared: the whole backbone (body and head, FedAvg). Personal: the bias b_i added to the features
("personalized representation bias", PRBM), trained with the model.
Local loss: CE(head(f(x) + b_i), y) + κ · mean(½ (m̄ − m_g)²) (the mean regularization, MR):
m̄ = (1 − ρ) m̄ + ρ · mean_batch f(x), a running mean of the features through the round (reset at its
start, earlier batches detached), m_g the global mean of features.
Upload: the model (and, in round 1, the running mean). Server: the models' sample-weighted mean; m_g,
once, the sample-weighted mean of the running means of round 1.
Prediction: head(f(x) + b_i).

Sources: TsingZ0/DBE clientDBE.py / serverDBE.py and PFLlib clientdbe.py (the same code); the authors'
Fashion-MNIST run (run_me.sh): κ = 50, ρ = 1 (the running mean is then the batch's own mean).
The bias steps by its plain gradient at the run's learning rate, as the reference's separate
`opt_client_mean` (a plain SGD), while the model takes the run's momentum and weight decay.
Differences: the reference computes m_g in a pass before round 1 (serverdbe.py `__init__`) in which every
client of the federation trains its `local_epochs` without b_i and the regularizer, m_g the sample-weighted
mean over all of them; round 1's `send_models` then overwrites the parameters that pass trained, but not the
BatchNorm statistics it moved (clientbase.py `set_parameters` copies parameters only), which each client keeps.
Here round 1 is that pass, with everything it trained kept (the curve is one FedAvg round ahead of the
reference's), and m_g averages round 1's cohort: every client only where all take part.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.capabilities import Carried
from algorithms.common import weighted_mean

BIAS, RUNNING = "dbe.bias", "dbe.running"
GLOBAL_MEAN, READY = "dbe.global_mean", "dbe.ready"


@dataclass
class FedDBEHparams:
    kappa: float = 50.0  # κ, weight of the mean regularization (authors' Fashion-MNIST run: -klw 50)
    rho: float = 1.0  # ρ, the running mean's momentum (authors' Fashion-MNIST run: -mo 1)


class FedDBE(Carried, Method):
    name = "feddbe"
    title = "FedDBE"
    origin = "roster"
    paper = "Zhang et al., NeurIPS 2023"
    source = "TsingZ0/DBE clientDBE.py (= PFLlib clientdbe.py)"
    Hparams = FedDBEHparams
    carried = (RUNNING,)  # updated by each step's forward

    def init_client(self, model):
        zeros = torch.zeros(self.net.feature_dim, device=model[self.net.param_keys[0]].device)
        return {**super().init_client(model), BIAS: zeros.clone(), RUNNING: zeros.clone()}

    def init_server(self, model):
        zeros = torch.zeros(self.net.feature_dim, device=model[self.net.param_keys[0]].device)
        return {**super().init_server(model), GLOBAL_MEAN: zeros, READY: torch.zeros((), device=zeros.device)}

    def phases(self):
        return [self.sgd(("body.", "head.", BIAS), plain=(BIAS,))]

    def begin_local(self, client, server, stats, at):
        return {RUNNING: torch.zeros_like(client[RUNNING])}

    def loss(self, state, server, x, y):
        f = self.net.features(state, x)
        running = (1 - self.hp.rho) * state[RUNNING] + self.hp.rho * f.mean(0)
        state[RUNNING].copy_(running.detach())  # carried to the next step
        ready = server[READY]  # round 1 (the reference's pass before training): no bias, no regularizer
        regularizer = (0.5 * (running - server[GLOBAL_MEAN]) ** 2).mean()  # MR
        return F.cross_entropy(self.net.head(state, f + ready * state[BIAS]), y) + ready * self.hp.kappa * regularizer

    def upload(self, client, server):
        return {**super().upload(client, server), RUNNING: client[RUNNING]}

    def aggregate(self, server, uploads, at):
        mean = weighted_mean(uploads, at.samples)
        ready = server[READY]
        global_mean = ready * server[GLOBAL_MEAN] + (1 - ready) * mean.pop(RUNNING)  # fixed after round 1
        return {**server, **mean, GLOBAL_MEAN: global_mean, READY: torch.ones_like(ready)}

    def logits(self, state, server, x):
        return self.net.head(state, self.net.features(state, x) + state[BIAS])
