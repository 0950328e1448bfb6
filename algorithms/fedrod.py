"""FedRoD (Chen & Chao, ICLR 2022): a generic head trained for the federation, a personal head on top.

Shared: body and generic head g ("body.", "head."). Personal: head p_i ("rod.head.").
Local loss: the balanced softmax on the generic route, CE(g(z) + log π_i, y) with π_i the client's
label distribution (eq. 5), plus CE(sg(g(z)) + p_i(sg(z)), y), whose gradient reaches p_i only.
Upload: body and g. Server: sample-weighted mean. Prediction: g(z) + p_i(z).
"""

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import label_counts

PERSONAL = "rod."
PRIOR = "rod.log_prior"


class FedRoD(Method):
    name = "fedrod"
    title = "FedRoD"
    origin = "baseline"
    paper = "Chen & Chao, ICLR 2022"
    source = "PFLlib clientrod.py"
    shared = ("body.", "head.")

    def init_client(self, model):
        head = {PERSONAL + k: model[k].clone() for k in self.net.keys(("head.",), params_only=False)}
        prior = torch.zeros(self.training.num_classes, device=model[self.net.param_keys[0]].device)
        return {**super().init_client(model), **head, PRIOR: prior}

    def statistics(self, state, server, x, y, w):
        return {"count": label_counts(y, w, self.training.num_classes)}

    def begin_local(self, client, server, stats, at):
        count = stats["count"]
        return {PRIOR: torch.log((count / count.sum().clamp(min=1)).clamp(min=1e-12))}  # absent classes: ~ -28

    def phases(self):
        return [self.sgd(("body.", "head.", PERSONAL + "head."))]

    def loss(self, state, server, x, y):
        z = self.net.features(state, x)
        generic = self.net.head(state, z)
        balanced = F.cross_entropy(generic + state[PRIOR], y)  # eq. 5
        personal = F.cross_entropy(generic.detach() + self.net.head(state, z.detach(), PERSONAL + "head."), y)
        return balanced + personal

    def logits(self, state, server, x):
        z = self.net.features(state, x)
        return self.net.head(state, z) + self.net.head(state, z, PERSONAL + "head.")
