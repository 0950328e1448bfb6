"""FedGH (Yi et al., ACM MM 2023): a generalized global header trained on the server from the clients' class prototypes.

Shared: the head (the server's "generalized global header"). Personal: the body.
Local training: CE of the personal body under the received head, both trained.
Upload: the client's class prototypes, the mean of its trained body's features per class (not the head).
Server: trains its head with CE on the uploaded (prototype, class) pairs, one epoch of SGD in
minibatches of the run's batch size, shuffled, at `server_lr`; the client's trained head is replaced
by the server's next round.
Prediction: the personal body with the server's head.

Sources: PFLlib clientgh.py / servergh.py (server_lr 1, its default). Differences: PFLlib's server
head is client 0's own head module (`self.clients[0].model.head`), so client 0's local training moves
it before the server trains; here the server trains its own head from where it left it. The pairs'
order is a keyed draw of the run's seed and round (PFLlib's DataLoader shuffles with torch's global
generator). A head with batch norm trains on the server with the normalization of its initial
statistics (mean 0, variance 1): the server holds no statistics of its own.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import grad

from algorithms.base import Method
from algorithms.common import class_sums, uniform

SUM, COUNT = "gh.sum", "gh.count"


@dataclass
class FedGHHparams:
    server_lr: float = 1.0  # the server's SGD step on its head (PFLlib's default)


class FedGH(Method):
    name = "fedgh"
    title = "FedGH"
    origin = "roster"
    paper = "Yi et al., ACM MM 2023"
    source = "PFLlib clientgh.py"
    Hparams = FedGHHparams
    shared = ("head.",)

    def init_client(self, model):
        c, k = self.training.num_classes, self.net.feature_dim
        device = model[self.net.param_keys[0]].device
        return {
            **super().init_client(model),
            SUM: torch.zeros(c, k, device=device),
            COUNT: torch.zeros(c, device=device),
        }

    def statistics(self, state, server, x, y, w):
        return class_sums(self.net.features(state, x), y, w, self.training.num_classes)

    def end_local(self, client, server, stats, at):
        return {SUM: stats["sum"], COUNT: stats["count"]}

    def upload(self, client, server):
        return {SUM: client[SUM], COUNT: client[COUNT]}

    def aggregate(self, server, uploads, at):
        held = (uploads[COUNT] > 0).flatten()
        protos = (uploads[SUM] / uploads[COUNT].clamp(min=1)[..., None]).flatten(0, 1)[held]  # (pairs, K)
        labels = torch.arange(self.training.num_classes, device=held.device).repeat(uploads[COUNT].shape[0])[held]
        key = torch.tensor((self.training.seed * 1_000_003 + at.number) % 2**32, dtype=torch.int64, device=held.device)
        order = torch.argsort(uniform(key, (len(labels),), protos.dtype))
        statistics = {
            k: v for k, v in self.net.initial_state().items() if k.startswith("head.") and self.net.is_buffer(k)
        }
        head = {k: v for k, v in server.items() if k.startswith("head.")}
        self.net.module.eval()  # batch norm in the head normalizes by its initial statistics (docstring)

        def ce(params, idx):
            return F.cross_entropy(self.net.head({**statistics, **params}, protos[idx]), labels[idx])

        batch = self.training.batch_size
        for start in range(0, len(order), batch):  # one epoch over the pairs
            g = grad(ce)(head, order[start : start + batch])
            head = {k: v - self.hp.server_lr * g[k] for k, v in head.items()}
        return {**server, **head}
