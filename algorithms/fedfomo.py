"""FedFomo (Zhang et al., ICLR 2021): each client weighs other clients' models by how much they
lower its own validation loss.

Server: every client's latest trained model ("fomo.models.", one slot per client; the initial
model until the client first trains) and the affinity matrix P (N × N), started at the identity
so that a client's own stored model is its first candidate.
Personal: the client's model θ_i, and θ_i^old ("fomo.old."), the model it began its last local
training from. 20 % of each client's training split is held out as its validation split
(`holdout`); local training sees the other 80 %.
Receiving: client i downloads the M stored models of highest affinity P_i (itself included).
Before training (eq. 3): w_ij = (L_i(θ_i^old) − L_i(θ_j)) / (‖θ_j − θ_i^old‖ + 1e-5), losses
on the validation split; (eq. 4) with the weights max(0, w_ij) normalised to sum 1,
θ_i ← Σ_j w_ij θ_j; if none is positive, θ_i stays. θ_i^old ← θ_i. Then the local epochs on
cross-entropy.
Upload: θ_i and the raw weights w_ij. Server: stores θ_i; P_ij += w_ij.
Prediction: θ_i.

Differences from the reference (PFLlib's clientfomo/serverfomo, which produced the GPFL and
FedCP tables): the validation loss is the mean over samples (PFLlib: the mean of batch means,
last batch kept); ties in P go to the next client ids (PFLlib: torch.topk's order); no ε-greedy
exploration (PFLlib has none either). The paper's eq. 4 step θ_i^old + Σ_j w_ij (θ_j − θ_i^old)
equals PFLlib's Σ_j w_ij θ_j because the weights sum to 1.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import vmap

from algorithms.base import Method
from algorithms.capabilities import HeldOut
from algorithms.common import per_client

MODELS, AFFINITY, OLD = "fomo.models.", "fomo.affinity", "fomo.old."
CHOSEN, WEIGHTS = "fomo.chosen", "fomo.weights"


@dataclass
class FedFomoHparams:
    m: int = 5  # models downloaded per round (the paper's recommendation, FedPAC's and PFLlib's value)


class FedFomo(HeldOut, Method):
    name = "fedfomo"
    title = "FedFomo"
    origin = "baseline"
    paper = "Zhang et al., ICLR 2021"
    source = "PFLlib clientfomo.py"
    Hparams = FedFomoHparams
    shared = ()
    holdout = 0.2  # PFLlib's val_ratio

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        self.downloads = min(self.hp.m, training.clients)  # M, never more than the clients

    def init_server(self, model):
        n = self.training.clients
        models = {MODELS + k: per_client(model[k], n) for k in self.net.param_keys}
        return {**models, AFFINITY: torch.eye(n, device=model[self.net.param_keys[0]].device)}

    def init_client(self, model):
        device = model[self.net.param_keys[0]].device
        slots = {
            CHOSEN: torch.zeros(self.downloads, dtype=torch.long, device=device),
            WEIGHTS: torch.zeros(self.downloads, device=device),
        }
        return {**super().init_client(model), **{OLD + k: model[k].clone() for k in self.net.param_keys}, **slots}

    def broadcast(self, client, server, at):
        n = server[AFFINITY].shape[0]
        # ties go to the next ids, the client itself first
        after = (torch.arange(n, device=at.clients.device) - at.clients) % n
        chosen = torch.topk(server[AFFINITY][at.clients] - 1e-6 * after, self.downloads).indices
        return {**client, CHOSEN: chosen}

    def candidates(self, state, server):
        """The downloaded models, read from the server's slots (no copy kept per client)."""
        return {k: server[MODELS + k][state[CHOSEN]] for k in self.net.param_keys}

    def statistics(self, state, server, x, y, w):
        def loss_of(params):
            return (F.cross_entropy(self.net.logits({**state, **params}, x), y, reduction="none") * w).sum()

        old = loss_of({k: state[OLD + k] for k in self.net.param_keys})
        return {"old": old, "others": vmap(loss_of)(self.candidates(state, server)), "n": w.sum()}

    def begin_local(self, client, server, stats, at):
        keys = self.net.param_keys
        others = self.candidates(client, server)
        n = stats["n"].clamp(min=1)
        gap = torch.sqrt(sum(((others[k] - client[OLD + k]) ** 2).flatten(1).sum(1) for k in keys))
        raw = (stats["old"] - stats["others"]) / n / (gap + 1e-5)  # eq. 3
        weight = raw.clamp(min=0)
        total = weight.sum()
        weight = weight / total.clamp(min=1e-12)
        combined = {
            k: torch.where(total > 0, torch.tensordot(weight, others[k], dims=1), client[k]) for k in keys
        }  # eq. 4
        return {
            **combined,
            **{OLD + k: combined[k].clone() for k in keys},
            WEIGHTS: raw,
        }  # a copy: aliased outputs share storage

    def upload(self, client, server):
        return {**{k: client[k] for k in self.net.param_keys}, CHOSEN: client[CHOSEN], WEIGHTS: client[WEIGHTS]}

    def aggregate(self, server, uploads, at):
        out = {
            **server,
            **{MODELS + k: server[MODELS + k].index_put((at.clients,), uploads[k]) for k in self.net.param_keys},
        }
        rows = at.clients[:, None].expand_as(uploads[CHOSEN])
        out[AFFINITY] = server[AFFINITY].index_put(
            (rows, uploads[CHOSEN]), uploads[WEIGHTS].to(server[AFFINITY].dtype), accumulate=True
        )
        return out
