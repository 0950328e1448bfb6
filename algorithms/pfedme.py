"""pFedMe (T. Dinh, Tran & Nguyen, NeurIPS 2020): personalised models as Moreau envelopes.

Shared: the local copy w_i of the global model ("body.", "head."). Personal: θ_i ("me.").
Before local training: θ_i ← the received global model (all three references: the authors'
CharlieDinh/pFedMe userpFedMe.set_parameters, PFLlib clientpFedMe.set_parameters, FL-bench),
so last round's θ_i predicts until the client trains again.
Local step (Algorithm 1) on each minibatch: θ_i ← the approximate minimiser of
f_i(θ; D) + λ/2 ‖θ − w_i‖² after K gradient steps of size `personal_lr` from the current θ_i (eq. 7;
within a round θ_i carries over from batch to batch);
then w_i ← w_i − η λ (w_i − θ_i) (eq. 8).
Both updates are one SGD step of size η on λ/2 ‖w − sg(θ*)‖² + ‖θ − sg(θ*)‖² / (2η): its
gradient moves w by η λ (w − θ*) and sets θ to θ* exactly (no momentum or weight decay here).
Upload: w_i. Server (eq. 10): w ← (1 − β) w + β · sample-weighted mean of the w_i.
Prediction: θ_i.

`pfedme-official` is the form of the code behind the published numbers: the authors'
(CharlieDinh/pFedMe) and PFLlib's until May 2023 (clientpFedMe.py at 68e5acf), which GPFL and FedCP
ran. Two differences: (1) the client predicts with w_i as local training left it, not θ_i: the
optimizer's `step` returns the model's own parameter tensors, and `update_parameters(model,
local_params)` then overwrites them with w_i, so the "personalized" evaluation reads w_i; PFLlib
since May 2023 evaluates the received model instead, a form no table ran. (2) The K inner steps carry
the optimizer's weight decay μ = 0.001 on θ (pFedMeOptimizer's default, no argument sets it in
either code). A client left out of a round predicts with the w_i of its last round (in PFLlib 2023
the received model; the tables ran every client each round). With batch norm, w_i predicts with θ's
running statistics: the references keep one module whose statistics the θ steps update.
"""

from dataclasses import dataclass, replace

import torch.nn.functional as F
from torch.func import grad

from algorithms.base import Method
from algorithms.optimizers import SGD

PERSONAL = "me."
TRAINED = "trained."  # pfedme-official: w_i as local training left it


@dataclass
class PFedMeHparams:
    lam: float = 10.0  # λ, the Moreau envelope's pull (FedPAC's tuned value)
    inner_steps: int = 5  # K (FedPAC's tuned value)
    personal_lr: float = 0.01  # step size of the K inner steps
    beta: float = 1.0  # β, the server's mixing of the old global model and the clients' mean


class PFedMe(Method):
    name = "pfedme"
    title = "pFedMe"
    origin = "baseline"
    paper = "Dinh et al., NeurIPS 2020"
    source = "the paper (θ_i predicts)"
    Hparams = PFedMeHparams
    theta_decay = 0.0  # the paper's eq. 7 has no decay on θ

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, PERSONAL)}

    def begin_local(self, client, server, stats, at):
        return {PERSONAL + k: client[k].clone() for k in self.net.param_keys}

    def phases(self):
        phase = self.sgd(("body.", "head.", PERSONAL))
        return [replace(phase, optimizer=SGD(self.training.lr))]  # the θ step is exact only for plain SGD

    def personal(self, state, x, y):
        """K steps on f_i(θ) + λ/2 ‖θ − w‖² from the current θ (eq. 7)."""
        keys = self.net.param_keys
        w = {k: state[k].detach() for k in keys}
        buffers = {k: state[PERSONAL + k] for k in self.net.buffer_keys}  # θ's own statistics, updated in place
        objective = lambda th, b: (  # noqa: E731
            F.cross_entropy(self.net.logits({**state, **b, **th}, x), y)
            + self.hp.lam / 2 * sum(((th[k] - w[k]) ** 2).sum() for k in keys)
            + self.theta_decay / 2 * sum((th[k] ** 2).sum() for k in keys)
        )
        theta = {k: state[PERSONAL + k].detach() for k in keys}
        for _ in range(self.hp.inner_steps):
            g = grad(objective)(theta, buffers)
            theta = {k: theta[k] - self.hp.personal_lr * g[k] for k in keys}
        return {k: v.detach() for k, v in theta.items()}

    def loss(self, state, server, x, y):
        theta = self.personal(state, x, y)
        keys = self.net.param_keys
        pull = self.hp.lam / 2 * sum(((state[k] - theta[k]) ** 2).sum() for k in keys)  # eq. 8 as a gradient step
        settle = sum(((state[PERSONAL + k] - theta[k]) ** 2).sum() for k in keys) / (2 * self.training.lr)
        return pull + settle

    def server_optimizer(self):
        return SGD(self.hp.beta)  # eq. 10: w ← (1 − β) w + β mean = w − β (w − mean)

    def logits(self, state, server, x):
        return self.net.logits(state, x, PERSONAL)


class PFedMeOfficial(PFedMe):
    """The authors' code's form (module docstring): predicts with the trained w_i; θ decays by μ = 0.001."""

    name = "pfedme-official"
    title = "pFedMe-official"
    paper = "Dinh et al., NeurIPS 2020"
    source = "CharlieDinh/pFedMe; PFLlib before May 2023"
    family = "pfedme"
    theta_decay = 0.001  # pFedMeOptimizer's mu

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, TRAINED)}

    def end_local(self, client, server, stats, at):
        params = {TRAINED + k: client[k].clone() for k in self.net.param_keys}
        return params | {
            TRAINED + k: client[PERSONAL + k].clone() for k in self.net.buffer_keys
        }  # θ's statistics (docstring)

    def logits(self, state, server, x):
        return self.net.logits(state, x, TRAINED)
