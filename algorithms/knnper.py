"""kNN-Per (Marfoq, Neglia, Vidal & Kameni, ICML 2022): the global model, interpolated with a
k-nearest-neighbour model over each client's own training features.

Shared: the whole model (trained as FedAvg). Personal: the datastore, the client's training
samples' features f(x) and labels under the global model, built for evaluation (not kept).
Prediction (eq. 4): p(y | x) = λ p_kNN(y | x) + (1 − λ) p_model(y | x), p_kNN the softmax of
−d² / (D · T) over the k nearest stored features (D the feature dimension), summed by label.

The scale D is the original code's (omarfoq/knn-per, client.py: exp(−d² / (D · scale)) over
the k neighbours); without it the weights are one-hot on 128- or 512-dimensional features and
the nearest neighbour's label always outvotes the model. λ stays fixed at 0.5 (FedPAC tunes
it over {0.5, …, 0.8} and states no chosen value; the paper picks λ per client on validation).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method, Passes

KEYS, LABELS, MASK = "knn.keys", "knn.labels", "knn.mask"


@dataclass
class KNNPerHparams:
    k: int = 10  # neighbours
    lam: float = 0.5  # λ, the kNN model's share
    temperature: float = 1.0  # T, the kernel's scale over −d² / D (the original code's `scale`)


class KNNPer(Method):
    name = "knn-per"
    title = "kNN-Per"
    Hparams = KNNPerHparams
    passes = Passes(memory=True)  # the datastore; training is FedAvg's

    def memory(self, state, server, x, y, w):
        return {KEYS: self.net.features(state, x), LABELS: y, MASK: w}

    def logits(self, state, server, x):
        f = self.net.features(state, x)
        model = F.softmax(self.net.head(state, f), -1)
        d2 = (f * f).sum(1)[:, None] + (state[KEYS] ** 2).sum(1)[None] - 2 * f @ state[KEYS].T
        d2 = d2 + 1e30 * (1 - state[MASK])[None]  # padding is never a neighbour
        near, idx = torch.topk(-d2, min(self.hp.k, d2.shape[1]), dim=1)
        weight = torch.softmax(near / (f.shape[1] * self.hp.temperature), 1)
        votes = F.one_hot(state[LABELS][idx], self.training.num_classes).to(weight.dtype)
        knn = (weight[..., None] * votes).sum(1)
        return torch.log(self.hp.lam * knn + (1 - self.hp.lam) * model + 1e-12)  # eq. 4
