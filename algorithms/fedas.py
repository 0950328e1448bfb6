"""FedAS (Yang et al., CVPR 2024): align the received body to local knowledge, weigh uploads by Fisher information.

Shared: the body. Personal: the head, the client's class prototypes.
Receiving (parameter alignment, for the round's clients): prototypes C_c, the class means of the features of
the client's own body as its last training left it; the received global body takes its place after one
epoch of plain SGD (`align_lr` 0.01, batches of 16) on
  Σ_{c in the batch} MSE(f_g(x_{y=c}), C_c)   (the mean over the class's samples and feature dims);
Local loss: CE of the aligned body and the client's head.
Upload: the trained body and the trace of its empirical Fisher information,
  F_i = Σ_b ‖∇_θ CE_b(θ_i)‖²  over the batches b of the run's size, every parameter of the trained model.
Server (client synchronization): Σ_i F_i θ_i^body / Σ_i F_i over the round's clients.
Prediction: the client's model.

Sources: the authors' xiyuanyang45/FedAS (a PFLlib fork; `wo_local` and `wo_global` are its ablation switches,
`fedas-nopa` and `fedas-nocs` here), and PFLlib clientas.py / serveras.py. Differences: the authors' server
hands every chosen client the same global model object, so each aligns the body the previous one already
aligned (an aliasing order effect); PFLlib hands each a copy, as here. The reference takes prototypes and the
trace over shuffled batches, the last partial one dropped (prototypes over batches of 16); here prototypes
over every sample, and the trace over the client's batches in its stored (randomly permuted) order, the last
partial batch dropped. The reference also computes the trace of every client outside the round and never
reads it; that work is not done. A client's head is never replaced: the server's mean of heads, which the
reference computes, no client reads.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from algorithms.base import Method
from algorithms.capabilities import BatchedStatistics
from algorithms.common import class_sums, weighted_mean
from algorithms.optimizers import SGD
from algorithms.rounds import Phase
from algorithms.variants import variant

PROTOS, HAS, FIM = "as.protos", "as.has", "as.fim"
ALIGN_BATCH = 16  # the reference's alignment loader


@dataclass
class FedASHparams:
    align_lr: float = 0.01  # the alignment's SGD step (the reference's)
    align: bool = True  # parameter alignment; False: the received body is taken as it is (the authors' wo_local)
    fisher: bool = True  # Fisher-weighted aggregation; False: the sample-weighted mean (the authors' wo_global)


class FedAS(BatchedStatistics, Method):
    name = "fedas"
    title = "FedAS"
    origin = "roster"
    paper = "Yang et al., CVPR 2024"
    source = "xiyuanyang45/FedAS (= PFLlib clientas.py)"
    Hparams = FedASHparams
    shared = ("body.",)

    def init_client(self, model):
        device, dtype = model[self.net.param_keys[0]].device, model[self.net.param_keys[0]].dtype
        c, d = self.training.num_classes, self.net.feature_dim
        slots = {
            PROTOS: torch.zeros(c, d, dtype=dtype, device=device),
            HAS: torch.zeros(c, dtype=dtype, device=device),
            FIM: torch.zeros((), dtype=dtype, device=device),
        }
        return {**super().init_client(model), **slots}

    def broadcast(self, client, server, at):
        return client  # the round's clients take the body in begin_local, after their prototypes are taken

    def statistics(self, state, server, x, y, w):
        return class_sums(self.net.features(state, x), y, w, self.training.num_classes)  # of the client's own body

    def begin_local(self, client, server, stats, at):
        protos = stats["sum"] / stats["count"].clamp(min=1)[:, None]
        body = {k: v for k, v in server.items() if self.is_shared(k)}
        return {**body, PROTOS: protos, HAS: (stats["count"] > 0).to(protos.dtype)}

    def alignment_loss(self, state, server, x, y):
        f = self.net.features(state, x)
        onehot = (y[:, None] == torch.arange(self.training.num_classes, device=y.device)).to(f.dtype)
        in_batch = onehot.sum(0)  # n_c, the class's samples in the batch
        per_sample = ((f - state[PROTOS][y]) ** 2).sum(1) / (in_batch[y] * f.shape[1])  # MSE over (n_c, d), per class
        return (per_sample * state[HAS][y]).sum()

    def phases(self):
        train = self.sgd(("body.", "head."))
        if not self.hp.align:
            return [train]
        return [Phase(("body.",), 1, SGD(self.hp.align_lr), self.alignment_loss, batch=ALIGN_BATCH), train]

    def trained_statistics(self, state, server, x, y, w):
        if not self.hp.fisher:
            return {}
        b = self.training.batch_size
        params = {k: state[k] for k in self.net.param_keys}

        def squared_gradient(xb, yb):
            g = grad(lambda p: F.cross_entropy(self.net.logits({**state, **p}, xb), yb))(params)
            return sum((v**2).sum() for v in g.values())

        whole = w.reshape(-1, b).prod(1)  # 1 for a batch of real samples only: the last partial batch is dropped
        norms = vmap(squared_gradient)(x.reshape(-1, b, *x.shape[1:]), y.reshape(-1, b))
        return {"fim": (norms * whole).sum()}

    def end_local(self, client, server, stats, at):
        return {FIM: stats["fim"]} if self.hp.fisher else {}

    def upload(self, client, server):
        return {**super().upload(client, server), FIM: client[FIM]}

    def aggregate(self, server, uploads, at):
        weights = uploads[FIM] if self.hp.fisher else at.samples
        weights = torch.where(weights.sum() > 0, weights, at.samples)  # no client held a whole batch: by samples
        return {**server, **weighted_mean({k: v for k, v in uploads.items() if k != FIM}, weights)}


VARIANTS = [variant(FedAS, "FedAS-noPA", align=False), variant(FedAS, "FedAS-noCS", fisher=False)]
