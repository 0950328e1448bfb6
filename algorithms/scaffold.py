"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct the clients' drift.

Shared: the whole model x and the server control variate c ("scaffold.c."). Personal: the
client control variate c_i ("scaffold.ci.").
Local step (Algorithm 1, line 10): y ← y − η (g_i(y) + c − c_i), an SGD step on
f_i(y) + ⟨y, c − c_i⟩.
After the K local steps (option II, line 12): c_i⁺ = c_i − c + (x − y_i) / (K̃ η).
K̃ = K under plain SGD, as the paper and its references run it. Under momentum m (FedPAC's
protocol runs every baseline with m = 0.5) K steps move y by η Σ_k (1 − m^k) / (1 − m) times
the mean direction, so K̃ is that sum; with K̃ = K the control variates overshoot by about
1 / (1 − m) and flip sign from round to round (measured: docs/reproduction.md, SCAFFOLD).
Upload: y_i and Δc_i = c_i⁺ − c_i. Server (lines 16-17, global step size 1): x = sample-weighted
mean of the y_i; c ← c + (|S| / N) · mean(Δc_i), so that c stays the mean of all clients' c_i.
Prediction: the global model.
"""

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import weighted_mean

C, CI, DELTA = "scaffold.c.", "scaffold.ci.", "scaffold.dci."


class SCAFFOLD(Method):
    name = "scaffold"
    title = "SCAFFOLD"
    origin = "baseline"
    paper = "Karimireddy et al., ICML 2020"
    source = "the paper (option II); PFLlib clientscaffold.py"
    shared = ("body.", "head.")

    def init_client(self, model):
        zeros = {pre + k: torch.zeros_like(model[k]) for k in self.net.param_keys for pre in (CI, DELTA)}
        return {**super().init_client(model), **zeros}

    def init_server(self, model):
        c = {C + k: torch.zeros_like(model[k]) for k in self.net.param_keys}
        return {**super().init_server(model), **c}

    def loss(self, state, server, x, y):
        correction = sum((state[k] * (server[C + k] - state[CI + k])).sum() for k in self.net.param_keys)
        return F.cross_entropy(self.net.logits(state, x), y) + correction

    def end_local(self, client, server, stats, at):
        t = self.training
        steps, m = at.steps, t.momentum  # K local steps, under momentum m
        if m:  # K̃ = Σ_{k=1..K} (1 − m^k) / (1 − m): the distance K momentum steps travel along a constant direction
            steps = (steps - m * (1 - m**steps) / (1 - m)) / (1 - m)
        out = {}
        for k in self.net.param_keys:
            new = client[CI + k] - server[C + k] + (server[k] - client[k]) / (steps.clamp(min=1) * t.lr)  # option II
            out |= {CI + k: new, DELTA + k: new - client[CI + k]}
        return out

    def upload(self, client, server):
        return {k: client[k] for k in [*self.net.param_keys, *(DELTA + k for k in self.net.param_keys)]}

    def aggregate(self, server, uploads, at):
        model = weighted_mean({k: uploads[k] for k in self.net.param_keys}, at.samples)
        share = len(at.clients) / self.training.clients
        control = {C + k: server[C + k] + share * uploads[DELTA + k].mean(0) for k in self.net.param_keys}
        return {**server, **model, **control}
