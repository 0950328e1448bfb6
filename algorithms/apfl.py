"""APFL (Deng, Kamani & Mahdavi, 2020): each client mixes a global and a local model with a learned α_i.

Shared: the global model w ("global."). Personal: the local model v_i ("body.", "head.") and α_i.
Local step (Algorithm 1), all three from one minibatch:
  w ← w − η ∇f_i(w);  v ← v − η ∇_v f_i(v̄);  α ← α − η ∇_α f_i(v̄),  v̄ = α v + (1 − α) w,
which is one SGD step on f_i(w) + f_i(α v + (1 − α) sg(w)) (sg: w gets no gradient from the mix).
With adapt_alpha, α_i follows its gradient too, used clipped to [0, 1] and projected there after
each round (the paper projects every step); by default α_i stays at its tuned value, as in
FedPAC's comparison (α = 0.25) and the reference implementations' default.
Upload: w. Server: sample-weighted mean. Prediction: the mixed model v̄.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method, Passes

GLOBAL = "global."
ALPHA = "apfl.alpha"


@dataclass
class APFLHparams:
    alpha: float = 0.25  # α_i, the local model's share (FedPAC's tuned value)
    adapt_alpha: bool = False  # learn α_i by gradient (the paper's adaptive APFL); else keep it fixed


class APFL(Method):
    name = "apfl"
    title = "APFL"
    Hparams = APFLHparams
    shared = (GLOBAL,)
    passes = Passes(end_local=True)  # α_i projected to [0, 1]

    def init_client(self, model):
        alpha = torch.tensor(self.hp.alpha, device=model[self.net.param_keys[0]].device)
        return {**super().init_client(model), **self.net.copy(model, GLOBAL), ALPHA: alpha}

    def phases(self):
        return [self.sgd((GLOBAL, "body.", "head.", *([ALPHA] if self.hp.adapt_alpha else [])))]

    def mixed(self, state, detach_global: bool):
        a = state[ALPHA].clamp(0.0, 1.0)
        w = lambda k: state[GLOBAL + k].detach() if detach_global else state[GLOBAL + k]  # noqa: E731
        return {**state, **{k: a * state[k] + (1 - a) * w(k) for k in self.net.param_keys}}

    def loss(self, state, server, x, y):
        global_loss = F.cross_entropy(self.net.logits(state, x, GLOBAL), y)
        return global_loss + F.cross_entropy(self.net.logits(self.mixed(state, True), x), y)

    def end_local(self, client, server, stats, at):
        return {ALPHA: client[ALPHA].clamp(0.0, 1.0)}

    def logits(self, state, server, x):
        return self.net.logits(self.mixed(state, False), x)
