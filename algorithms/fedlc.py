"""FedLC (Zhang et al., ICML 2022): federated learning with label distribution skew via logits calibration.

Shared: the whole backbone. Personal: the client's label counts n_{i,y} ("lc.counts", counted on its
training split before it trains).
Local loss: cross-entropy of the calibrated logits f_y(x) − τ n_{i,y}^{−1/4}: a class the client has
seen rarely has its logit lowered in training, so its pairwise margin against the frequent classes is
enforced more strongly (the paper's calibrated loss).
Upload / server / prediction: as FedAvg (the global model predicts, uncalibrated).

Sources: FL-bench src/client/fedlc.py, whose form this is: the client's own counts (the paper's n_{c,y}), a
class it lacks counted as 1e-8 (its calibration 100 τ: out of the softmax in effect), the full softmax. τ = 1
(PFLlib's -tau, FL-bench's default). The paper's own code is not public. Its calibrated loss divides by
Σ_{y'≠y} e^{f_y' − Δ_y'}, the true class left out: PFLlib wrote that form (clientlc.py, logits_calibration)
and left it commented out; its gradient in f_y is −1 whatever the margin, so it never saturates and the
logits grow without bound; both codes train with the full softmax instead, as here.
`fedlc-pfllib` is PFLlib's form (serverlc.py): every client calibrated by the counts of the whole federation,
one vector for all (`Federation.class_counts`). Under strong skew a one-class client's calibrated loss here is
zero (every other class is out of its softmax), so it teaches nothing; PFLlib's form, whose calibration is the
same for every client, trains as a FedAvg with a fixed logit offset (the curves of both: docs/methods.md).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method
from algorithms.common import label_counts

COUNTS = "lc.counts"
ABSENT = 1e-8  # the count a class the client lacks takes (FL-bench)


@dataclass
class FedLCHparams:
    tau: float = 1.0  # τ, the calibration's strength


class FedLC(Method):
    name = "fedlc"
    title = "FedLC"
    origin = "roster"
    paper = "Zhang et al., ICML 2022"
    source = "FL-bench fedlc.py"
    Hparams = FedLCHparams

    def init_client(self, model):
        return {**super().init_client(model), COUNTS: next(iter(model.values())).new_ones(self.training.num_classes)}

    def statistics(self, state, server, x, y, w):
        return {"labels": label_counts(y, w, self.training.num_classes)}

    def begin_local(self, client, server, stats, at):
        return {COUNTS: stats["labels"].clamp(min=ABSENT)}

    def loss(self, state, server, x, y):
        calibration = self.hp.tau * state[COUNTS] ** -0.25
        return F.cross_entropy(self.net.logits(state, x) - calibration, y)


class FedLCPfllib(FedLC):
    """PFLlib's form of FedLC: the federation's label counts calibrate every client (module docstring)."""

    name = "fedlc-pfllib"
    title = "FedLC-PFLlib"
    source = "PFLlib clientlc.py / serverlc.py"
    family = "fedlc"

    def begin_local(self, client, server, stats, at):
        counts = torch.tensor(
            self.training.federation.class_counts, dtype=client[COUNTS].dtype, device=client[COUNTS].device
        )
        return {COUNTS: counts}
