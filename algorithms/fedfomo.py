"""FedFomo (Zhang et al., ICLR 2021): each client weighs other clients' models by how much they
lower its own loss.

Server: every client's latest model ("fomo.models.", one slot per client) and the affinity
matrix P (N × N), the weights each client has given each other client so far.
Receiving: client i downloads the M models of highest affinity P_i (ties: the next client ids).
Before training (eq. 3): w_ij = max(0, (L_i(θ_i) − L_i(θ_j)) / ‖θ_j − θ_i‖) on the client's
training data (the paper holds out a validation split), normalised to sum 1 (all 0: keep θ_i);
θ_i ← θ_i + Σ_j w_ij (θ_j − θ_i) (eq. 4). Then the local epochs on cross-entropy.
Upload: θ_i and the weights it gave. Server: stores θ_i; P_ij += w_ij.
Prediction: θ_i. No ε-greedy exploration (PFLlib's form: top-M by affinity).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import vmap

from algorithms.base import Method

MODELS, AFFINITY = "fomo.models.", "fomo.affinity"
CHOSEN, WEIGHTS = "fomo.chosen", "fomo.weights"


@dataclass
class FedFomoHparams:
    m: int = 5  # models downloaded per round (FedPAC's tuned value)


class FedFomo(Method):
    name = "fedfomo"
    title = "FedFomo"
    Hparams = FedFomoHparams
    shared = ()
    stats_before = True  # the loss of the client's model and of each candidate

    def init_server(self, model, num_clients):
        self.downloads = min(self.hp.m, num_clients - 1)  # M, never more than the other clients (the engine makes the server first)
        models = {MODELS + k: model[k].unsqueeze(0).repeat(num_clients, *[1] * model[k].dim()).clone() for k in self.net.param_keys}
        return {**models, AFFINITY: torch.zeros(num_clients, num_clients, device=model[self.net.param_keys[0]].device)}

    def init_client(self, model):
        device = model[self.net.param_keys[0]].device
        ids = torch.zeros(self.downloads, dtype=torch.long, device=device)
        return {**super().init_client(model), CHOSEN: ids, WEIGHTS: torch.zeros(self.downloads, device=device)}

    def broadcast(self, client, server, index):
        n = server[AFFINITY].shape[0]
        ids = torch.arange(n, device=index.device)
        after = (ids - index) % n  # ties go to the next ids; the client itself comes last
        score = server[AFFINITY][index] - 1e-6 * after - 1e9 * (after == 0)
        return {**client, CHOSEN: torch.topk(score, self.downloads).indices}

    def candidates(self, state, server):
        """The downloaded models, read from the server's slots (no copy kept per client)."""
        return {k: server[MODELS + k][state[CHOSEN]] for k in self.net.param_keys}

    def statistics(self, state, server, x, y, w):
        own = (F.cross_entropy(self.net.logits(state, x), y, reduction="none") * w).sum()

        def loss_of(candidate):
            return (F.cross_entropy(self.net.logits({**state, **candidate}, x), y, reduction="none") * w).sum()

        others = vmap(loss_of)(self.candidates(state, server))
        return {"own": own, "others": others, "n": w.sum()}

    def begin_local(self, client, server, stats):
        keys = self.net.param_keys
        others = self.candidates(client, server)
        n = stats["n"].clamp(min=1)
        gap = torch.sqrt(sum(((others[k] - client[k]) ** 2).flatten(1).sum(1) for k in keys))
        weight = torch.clamp((stats["own"] - stats["others"]) / n / gap.clamp(min=1e-12), min=0)  # eq. 3
        weight = weight / weight.sum().clamp(min=1e-12)
        moved = {k: client[k] + torch.tensordot(weight, others[k] - client[k], dims=1) for k in keys}  # eq. 4
        return {**moved, WEIGHTS: weight}

    def upload(self, client, server):
        return {**{k: client[k] for k in self.net.param_keys}, CHOSEN: client[CHOSEN], WEIGHTS: client[WEIGHTS]}

    def aggregate(self, server, uploads, weights, ids):
        out = {**server, **{MODELS + k: server[MODELS + k].index_put((ids,), uploads[k]) for k in self.net.param_keys}}
        rows = ids[:, None].expand_as(uploads[CHOSEN])
        out[AFFINITY] = server[AFFINITY].index_put((rows, uploads[CHOSEN]), uploads[WEIGHTS], accumulate=True)
        return out
