"""FedProto (Tan et al., AAAI 2022): clients exchange class prototypes instead of weights.

Shared: nothing of the model. Server: global prototypes C_k, the count-weighted mean of the
clients' class means of features (eq. 6).
Local loss: CE + λ ‖f(x) − C_y‖² (eq. 8) in the reference code's scale, the mean over batch and
feature dimensions (its MSELoss, for which λ = 1 was set; the sum over 512 features diverges on
Fashion-MNIST dir:0.1 at lr 0.005); classes without a global prototype yet add nothing.
Upload: each client's per-class feature sums and counts after training.
Prediction: the class of the nearest global prototype to f(x).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import class_sums

SUM, COUNT = "proto.sum", "proto.count"
PROTOS, HAS = "proto.global", "proto.has"


@dataclass
class FedProtoHparams:
    lam: float = 1.0  # λ, weight of the prototype distance (PFLlib's default)


class FedProto(Method):
    name = "fedproto"
    title = "FedProto"
    origin = "baseline"
    paper = "Tan et al., AAAI 2022"
    source = "PFLlib clientproto.py"
    Hparams = FedProtoHparams
    shared = ()

    def init_client(self, model):
        c, k = self.training.num_classes, self.net.feature_dim
        device = model[self.net.param_keys[0]].device
        return {
            **super().init_client(model),
            SUM: torch.zeros(c, k, device=device),
            COUNT: torch.zeros(c, device=device),
        }

    def init_server(self, model):
        c, k = self.training.num_classes, self.net.feature_dim
        device = model[self.net.param_keys[0]].device
        return {PROTOS: torch.zeros(c, k, device=device), HAS: torch.zeros(c, device=device)}

    def loss(self, state, server, x, y):
        f = self.net.features(state, x)
        distance = ((f - server[PROTOS][y]) ** 2).mean(1) * server[HAS][y]
        return F.cross_entropy(self.net.head(state, f), y) + self.hp.lam * distance.mean()  # eq. 8

    def statistics(self, state, server, x, y, w):
        return class_sums(self.net.features(state, x), y, w, self.training.num_classes)

    def end_local(self, client, server, stats, at):
        return {SUM: stats["sum"], COUNT: stats["count"]}

    def upload(self, client, server):
        return {SUM: client[SUM], COUNT: client[COUNT]}

    def aggregate(self, server, uploads, at):
        count = uploads[COUNT].sum(0)
        protos = uploads[SUM].sum(0) / count.clamp(min=1)[:, None]  # eq. 6, weighted by class counts
        has = count > 0
        return {
            PROTOS: torch.where(has[:, None], protos, server[PROTOS]),
            HAS: torch.maximum(server[HAS], has.to(count.dtype)),
        }

    def logits(self, state, server, x):
        f = self.net.features(state, x)
        distance = ((f[:, None, :] - server[PROTOS][None]) ** 2).sum(-1)
        return -distance - 1e9 * (1 - server[HAS])  # a class without a prototype is never predicted
