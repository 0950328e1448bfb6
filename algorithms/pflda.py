"""PFL-DA (Zhang et al., Technometrics 2023): personalized FL through domain adaptation of a local feature extractor.

Shared: a global head ("ghead.", a copy of the head). Personal: the whole backbone (body and head).
Local training, two phases a round:
  1. the personal head, with CE(head(body(x)), y) + λ‖head − ghead‖₂ (the pull toward the global head);
  2. the personal body and the global head, with CE(ghead(body(x)), y): the body adapts to the global
     head, and the global head learns from every client's features.
Upload: the global head. Server: its sample-weighted mean. Prediction: the personal body and head.

Sources: PFLlib clientda.py / serverda.py (no authors' code is public). PFLlib builds the pull from
`.data` copies of both heads, so there it has no gradient and phase 1 is plain CE: λ = 0 here is
PFLlib's form exactly. Here the pull's gradient flows, as the paper's penalty means; λ = 1 is PFLlib's default.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method

GLOBAL_HEAD = "ghead."


@dataclass
class PFLDAHparams:
    lam: float = 1.0  # λ, weight of the pull of the personal head toward the global one (PFLlib's default)


class PFLDA(Method):
    name = "pflda"
    title = "PFL-DA"
    origin = "roster"
    paper = "Zhang et al., Technometrics 2023"
    source = "PFLlib clientda.py"
    Hparams = PFLDAHparams
    shared = (GLOBAL_HEAD,)

    def init_client(self, model):
        heads = {GLOBAL_HEAD + k.removeprefix("head."): v.clone() for k, v in model.items() if k.startswith("head.")}
        return {**super().init_client(model), **heads}

    def phases(self):
        return [self.sgd(("head.",), loss=self.head_loss), self.sgd(("body.", GLOBAL_HEAD), loss=self.body_loss)]

    def head_loss(self, state, server, x, y):
        gap = torch.cat(
            [(state[k] - state[GLOBAL_HEAD + k.removeprefix("head.")]).flatten() for k in self.net.keys(("head.",))]
        )
        pull = torch.linalg.vector_norm(gap)  # ‖head − ghead‖₂ (its gradient at 0, where both start, is 0)
        return F.cross_entropy(self.net.logits(state, x), y) + self.hp.lam * pull

    def body_loss(self, state, server, x, y):
        return F.cross_entropy(self.net.head(state, self.net.features(state, x), GLOBAL_HEAD), y)
