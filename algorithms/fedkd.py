"""FedKD (Wu et al., Nature Communications 2022): a shared student and a personal teacher distil each other;
the student travels compressed by truncated SVD.

Shared: the student ("global."), compressed. Personal: the teacher ("body.", "head.") and W_h, a linear
map between their features ("kd.W").
Local loss, one step of both models and W_h on the sum of the teacher's and the student's losses
(each backward reaches every model, as the reference's two backward passes do):
  CE_t + CE_s + (KL(p_s ‖ p_t) + KL(p_t ‖ p_s) + 2 MSE(f_t, W_h f_s)) / (CE_t + CE_s)
(KL and MSE averaged over every element, as torch's KLDivLoss and MSELoss by default); each model's
gradient clipped at norm 10 on its own.
Upload: the student, each weight matrix cut to the fewest singular values whose energy (Σσ²) passes the
share e of the total (a conv weight: its k×k kernels, with one rank for all); e rises from T_start to
T_end over the run. Server: the uploads' plain mean, cut the same way, which the clients take as their student.
Prediction: the teacher.

Sources: PFLlib clientkd.py / serverkd.py (T_start 0.95, T_end 0.98; after wuch15/FedKD run.py): student
and teacher of one architecture, as there (the paper's smaller student is not in it). The reference's
rank search keeps nothing when the energy passes the share only with the last singular value (the weight
is then sent as zeros); so does this. The student's lr is the run's (PFLlib's mentee lr defaults to the same 0.005).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from algorithms.base import Method

STUDENT, W, ENERGY = "global.", "kd.W", "kd.energy"


@dataclass
class FedKDHparams:
    t_start: float = 0.95  # the energy share kept by the SVD at the first round (PFLlib's T_start)
    t_end: float = 0.98  # ... at the last (PFLlib's T_end)


def truncated(w: torch.Tensor, energy) -> torch.Tensor:
    """w rebuilt from its leading singular values (PFLlib's decomposition): vectors and one-row weights
    travel whole; a 4-d weight is cut as its k×k kernels, with one rank for all."""
    if w.dim() < 2 or w.shape[0] <= 1:
        return w
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    per_rank = (s**2).reshape(-1, s.shape[-1]).sum(0)  # σ² per singular index, over all kernels
    total = per_rank.sum()
    before = torch.cumsum(per_rank, 0) - per_rank  # energy of the first n values, n = 0 … k−1
    passes = before > energy * total
    rank = torch.where(passes.any(), passes.to(torch.int64).argmax(), 0)  # the first n that passes; none: 0
    keep = (torch.arange(s.shape[-1], device=w.device) < rank).to(s.dtype)
    cut = (u * (s * keep)[..., None, :]) @ vh
    return torch.where(total > 0, cut, w)


class FedKD(Method):
    name = "fedkd"
    title = "FedKD"
    origin = "roster"
    paper = "Wu et al., Nature Communications 2022"
    source = "PFLlib clientkd.py"
    Hparams = FedKDHparams
    shared = (STUDENT,)

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        device = next(net.module.parameters()).device
        # drawn with the backbone, under the run's seed
        self.w_h = nn.Linear(net.feature_dim, net.feature_dim, bias=False).to(device)

    def init_client(self, model):
        return {**super().init_client(model), **self.net.copy(model, STUDENT), W: self.w_h.weight.detach().clone()}

    def init_server(self, model):
        return {
            **super().init_server(model),
            ENERGY: torch.tensor(float(self.hp.t_start), device=model[self.net.param_keys[0]].device),
        }

    def phases(self):
        groups = (("body.", "head."), (STUDENT,), (W,))  # the teacher, the student, W_h
        return [self.sgd(("body.", "head.", STUDENT, W), clip=10.0, clip_groups=groups)]

    def loss(self, state, server, x, y):
        f_t, f_s = self.net.features(state, x), self.net.features(state, x, STUDENT + "body.")
        z_t, z_s = self.net.head(state, f_t), self.net.head(state, f_s, STUDENT + "head.")
        ce_t, ce_s = F.cross_entropy(z_t, y), F.cross_entropy(z_s, y)
        kl = (
            F.kl_div(F.log_softmax(z_t, 1), F.softmax(z_s, 1), reduction="sum")
            + F.kl_div(F.log_softmax(z_s, 1), F.softmax(z_t, 1), reduction="sum")
        ) / z_t.numel()
        hidden = F.mse_loss(f_t, f_s @ state[W].T)
        return ce_t + ce_s + (kl + 2 * hidden) / (ce_t + ce_s)

    def upload(self, client, server):
        return {k: truncated(v, server[ENERGY]) for k, v in super().upload(client, server).items()}

    def aggregate(self, server, uploads, at):
        mean = {k: v.mean(0) for k, v in uploads.items()}  # a plain mean, as PFLlib's FedKD server
        # the next round's share
        after = self.hp.t_start + at.number / self.training.rounds * (self.hp.t_end - self.hp.t_start)
        return {
            **server,
            **{k: truncated(v, server[ENERGY]) for k, v in mean.items()},
            ENERGY: torch.full_like(server[ENERGY], after),
        }
