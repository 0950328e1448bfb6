"""FedNTD (Lee et al., NeurIPS 2022): preserve the global model's knowledge of the not-true classes.

Shared: the whole backbone. Personal: nothing.
Local loss (eq. 5): CE(f(x; w), y) + β · L_NTD, where L_NTD = τ² · KL(q̃_g ‖ q̃_l) between the received
global model's and the local model's softmax(z/τ) over the classes other than the sample's label
(its not-true logits, eq. 4), batch mean; the global model is frozen (no gradient) and in eval mode.
Upload / server / prediction: as FedAvg (the global model predicts).

Sources: Lee-Gihun/FedNTD (algorithms/fedntd/criterion.py `NTD_Loss._ntd_loss`, config/fedntd.json: τ = 1,
β = 1) and PFLlib clientntd.py (a copy of it): both multiply the KL by τ² (the usual distillation scale,
which the paper's eq. 4 leaves out; here as both codes). Both run the received model in eval mode:
PFLlib's `set_parameters` calls `.eval()`, and the authors' `_keep_global` deep-copies the client model,
which their `evaluate_model` left in eval mode. The not-true softmax is the full softmax with the label's
logit at −∞ (the same values as gathering the other logits, with no shape that depends on y).

With batch norm, the received model normalizes with the client's running statistics as its round began
(kept at `begin_local`; the server holds none), as the authors' copy of the client model at the round's start,
and writes none (`Net.predict`). Differences: PFLlib's global model carries the first uploader's statistics.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method

RECEIVED_STATS = "ntd.stats."  # the client's BatchNorm statistics as its round began: the received model's


@dataclass
class FedNTDHparams:
    beta: float = 1.0  # β, weight of the not-true distillation (authors' config)
    tau: float = 1.0  # τ, the softmax temperature (authors' config)


def not_true_kl(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, tau) -> torch.Tensor:
    """KL(teacher ‖ student) of the tempered softmaxes over each sample's not-true classes, batch mean (eq. 4)."""
    true = y[:, None] == torch.arange(student.shape[-1], device=y.device)  # (one_hot reads values: vmap refuses it)
    log_p = F.log_softmax(student.masked_fill(true, float("-inf")) / tau, -1)
    log_q = F.log_softmax(teacher.masked_fill(true, float("-inf")) / tau, -1)
    terms = torch.where(true, 0.0, log_q.exp() * (log_q - log_p))
    return terms.sum(-1).mean()


class FedNTD(Method):
    name = "fedntd"
    title = "FedNTD"
    origin = "roster"
    paper = "Lee et al., NeurIPS 2022"
    source = "Lee-Gihun/FedNTD"
    Hparams = FedNTDHparams

    def init_client(self, model):
        model = super().init_client(model)
        return {**model, **{RECEIVED_STATS + k: model[k].clone() for k in self.net.buffer_keys}}

    def begin_local(self, client, server, stats, at):
        # the received model as the authors' `_keep_global` copies it at the round's start: the client's statistics
        return {RECEIVED_STATS + k: client[k] for k in self.net.buffer_keys}

    def loss(self, state, server, x, y):
        logits = self.net.logits(state, x)
        # the global model of this round, frozen, in eval mode, with the statistics the round started with
        frozen = {k: state[RECEIVED_STATS + k] for k in self.net.buffer_keys}
        received = self.net.predict({**state, **server, **frozen}, x).detach()
        distillation = self.hp.tau**2 * not_true_kl(logits, received, y, self.hp.tau)  # τ² as both references
        return F.cross_entropy(logits, y) + self.hp.beta * distillation  # eq. 5
