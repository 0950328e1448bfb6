"""FedPHP (Li et al., ECML-PKDD 2021): a personalised model inherited across rounds teaches the
model trained from the global one.

Shared: the whole model. Personal: the historical personalised model, HPM ("php.private."), and
how often the client has trained ("php.count").
Receiving: the client's model ← the global model (FedAvg's broadcast).
Local loss: (1 − λ) CE(w) + λ MMD(f_w(x), f_HPM(x)), RBF kernels of bandwidths 10, 15, 20, 50;
the HPM is the teacher and is not trained.
After training (inheritance): HPM ← μ_i HPM + (1 − μ_i) w, μ_i = μ · cnt_i / (ρ T) capped at μ,
cnt_i the client's earlier rounds of training (0 the first time: the HPM becomes w).
Upload: w, trained from the global model. Server: sample-weighted mean. Prediction: the HPM.
This is the paper's Algorithm and its authors' code (FedRepo's fedphp.py: update_local,
generate_mu, update_hpm; MMD as its reg_way), the default.

`fedphp-pfllib` is PFLlib's form (clientphp.py, as it stood up to Nov 2024), which produced the FedPHP
rows of the GPFL and FedCP tables: receiving w ← (1 − μ_R) w_global + μ_R w, the teacher is the global
model, the mixture is trained, uploaded and predicts. μ_R = μ R / T with R PFLlib's 0-based round index
(its server calls set_parameters(model, i) for i = 0 … T): round 1 trains from the global model alone, and
the model evaluated after round R, received with R rounds done, mixes with μ R / T: μ after the last round,
never more.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import mmd

PRIVATE, TEACHER, COUNT = "php.private.", "php.teacher.", "php.count"


@dataclass
class FedPHPHparams:
    mu: float = 0.9  # μ, the inheritance at its largest (the authors' code: 0.9)
    lam: float = 0.5  # λ, weight of the MMD transfer


class FedPHP(Method):
    name = "fedphp"
    title = "FedPHP"
    origin = "baseline"
    paper = "Li et al., ECML-PKDD 2021"
    source = "the paper; FedRepo fedphp.py"
    Hparams = FedPHPHparams

    teacher_prefix = PRIVATE  # the HPM teaches

    def init_client(self, model):
        return {
            **super().init_client(model),
            **self.net.copy(model, PRIVATE),
            COUNT: torch.zeros((), device=model[self.net.param_keys[0]].device),
        }

    def loss(self, state, server, x, y):
        f = self.net.features(state, x)
        teacher = self.net.features(state, x, self.teacher_prefix + "body.").detach()
        return (1 - self.hp.lam) * F.cross_entropy(self.net.head(state, f), y) + self.hp.lam * mmd(f, teacher)

    def end_local(self, client, server, stats, at):
        t = self.training
        # generate_mu
        mu = torch.clamp(self.hp.mu * client[COUNT] / max(1.0, t.participation * t.rounds), max=self.hp.mu)
        # BatchNorm statistics too
        floats = [k for k in self.net.param_keys + self.net.buffer_keys if client[k].is_floating_point()]
        inherited = {PRIVATE + k: mu * client[PRIVATE + k] + (1 - mu) * client[k] for k in floats}  # update_hpm
        return {**client, **inherited, COUNT: client[COUNT] + 1}

    def logits(self, state, server, x):
        return self.net.logits(state, x, PRIVATE)


class FedPHPPfllib(FedPHP):
    """PFLlib's form of FedPHP (module docstring): no HPM; the inherited mixture is trained and predicts."""

    name = "fedphp-pfllib"
    title = "FedPHP-PFLlib"
    paper = "Li et al., ECML-PKDD 2021"
    source = "PFLlib clientphp.py (up to Nov 2024)"
    family = "fedphp"
    end_local = Method.end_local  # no inheritance step after training
    teacher_prefix = TEACHER  # the global model teaches

    def init_client(self, model):
        return {**Method.init_client(self, model), **self.net.copy(model, TEACHER)}

    def broadcast(self, client, server, at):
        out = super().broadcast(client, server, at)
        mu = self.hp.mu * (at.number - 1) / at.total  # μ_R, R the rounds done (PFLlib's 0-based i)
        keys = self.net.param_keys
        own = {k: (1 - mu) * server[k] + mu * client[k] for k in keys}
        return {**out, **own, **{TEACHER + k: server[k] for k in keys}}

    def logits(self, state, server, x):
        return self.net.logits(state, x)
