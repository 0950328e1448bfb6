"""FML (Shen et al., 2020, "Federated Mutual Learning"): a shared meme model and a personal local
model teach each other on every minibatch (deep mutual learning).

Shared: the meme model ("meme.body.", "meme.head."). Personal: the local model ("body.", "head.").
Local step (eqs. 1-2), both models at once on each minibatch:
  local: α CE(p_local, y) + (1 − α) KL(p_meme ‖ p_local)
  meme:  β CE(p_meme, y) + (1 − β) KL(p_local ‖ p_meme)
each model's target distribution held fixed in its own loss (the other's prediction is the teacher).
Upload: the meme model. Server: sample-weighted mean (FedAvg). Prediction: the local model.

Sources: the paper (α = β = 0.5); PFLlib clientfml.py runs the same two losses with three differences:
its KL is nn.KLDivLoss's default "mean" (over batch x classes, so 1/C of the per-sample KL here), each
model also receives the gradient of the other's KL through its softmax (the teacher is not detached),
and both gradients are clipped at norm 10. Here the paper's per-sample KL with detached teachers.
"""

from dataclasses import dataclass

import torch.nn.functional as F

from algorithms.base import Method

MEME = "meme."


@dataclass
class FMLHparams:
    alpha: float = 0.5  # α, the local model's share of the labels (the rest: the meme's teaching)
    beta: float = 0.5  # β, the meme model's share of the labels (the rest: the local model's teaching)


def kl(teacher_logits, student_logits):
    """KL(p_teacher ‖ p_student) per sample, batch mean; the teacher held fixed."""
    return F.kl_div(
        F.log_softmax(student_logits, -1),
        F.log_softmax(teacher_logits.detach(), -1),
        reduction="batchmean",
        log_target=True,
    )


class FML(Method):
    name = "fml"
    title = "FML"
    origin = "roster"
    paper = "Shen et al., 2020"
    source = "the paper; PFLlib clientfml.py"
    Hparams = FMLHparams
    shared = (MEME,)

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, MEME)}

    def phases(self):
        return [self.sgd(("body.", "head.", MEME))]

    def loss(self, state, server, x, y):
        local, meme = self.net.logits(state, x), self.net.logits(state, x, MEME)
        a, b = self.hp.alpha, self.hp.beta
        local_loss = a * F.cross_entropy(local, y) + (1 - a) * kl(meme, local)  # eq. 1
        meme_loss = b * F.cross_entropy(meme, y) + (1 - b) * kl(local, meme)  # eq. 2
        return local_loss + meme_loss  # each term moves one model only: the teachers are detached
