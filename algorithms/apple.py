"""APPLE (Luo & Wu, IJCAI 2022): each client learns how much of every client's core model to take.

Server: every client's core model c_j ("apple.cores.", one slot per client), each its own random
initialisation (client 0's is the run's initial model).
Personal: the client's own core c_i (the backbone's keys, the one core it trains) and its directed
relationship vector p_i ("apple.p", one weight per client), both started at the federation's
sample shares p_0 (n_j / Σ n).
Receiving: every core, c_i its own among them.
Local loss (Algorithm 1), the personalized model w_i = Σ_j p_ij c_j:
  CE(w_i) + λ(r) ‖p_i − p_0‖²,  λ(r) = μ · 0.001^(r/L) (or μ · (cos(πr/L) + 1)/2) for r < L = ⌊R·reg_share⌋, 0 after,
trained in c_i (at the run's lr: its gradient is p_ii ∂CE/∂w) and in p_i (at `lr_p`) in the same steps; the
other cores stay as received.
Upload: c_i. Server: stores it as client i's core.
Prediction: w_i as local training left it (the other cores as the client received them that round).

Sources: the authors' ljaiverson/pFL-APPLE (train_APPLE.py, utils/apple.py, utils/losses.py: lr_coef 0.001,
μ 0.1, reg_last_round_over_total_round 0.1, the exponential scheduler by default), whose forward mixes
each layer's outputs Σ_j p_j layer_j(x): for convolutions and linear layers that is the layer of the mixed
weights, as here. Differences: the bandwidth-limited download (`limit_downloaded_models`, off by
default there) is not built: every client receives every core. The authors' optimizer has momentum 0.9;
here the run's momentum, as for every method. Buffers (batch norm statistics) are the client's own, not
mixed. PFLlib's clientapple.py is another algorithm: it starts p_i at 1/N, steps c_i at N·lr, takes p_i's
gradient as the mean over tensors of mean(∂CE/∂w ⊙ c_j), replaces each core by its client's mixed model
after training, and trains the clients one after another against cores the earlier ones already moved;
none of that is copied.
"""

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F

from algorithms.base import Method, Unsupported
from algorithms.common import is_on
from algorithms.optimizers import SGD

CORES, P, P0, OWN, REG, MIX = "apple.cores.", "apple.weights", "apple.start", "apple.own", "apple.reg", "apple.mix."


@dataclass
class APPLEHparams:
    lr_p: float = 0.001  # the relationship vector's learning rate (the authors' lr_coef)
    mu: float = 0.1  # μ, the weight of the pull toward p_0 (the authors' default)
    reg_share: float = 0.1  # L / R: the share of the run's rounds the pull lasts (reg_last_round_over_total_round)
    # λ(r)'s shape (the authors' default; "cosine" the paper's other)
    schedule: Literal["exponential", "cosine"] = "exponential"

    def __post_init__(self):
        if self.schedule not in ("exponential", "cosine") or not 0 <= self.reg_share <= 1:
            raise Unsupported(
                "APPLE's schedule is exponential or cosine and reg_share lies in [0, 1]; got "
                f"{self.schedule!r} and {self.reg_share}."
            )


class APPLE(Method):
    name = "apple"
    title = "APPLE"
    origin = "roster"
    paper = "Luo & Wu, IJCAI 2022"
    source = "ljaiverson/pFL-APPLE"
    Hparams = APPLEHparams
    shared = ()

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        if len(training.federation.client_samples) != training.clients:
            raise Unsupported(
                "APPLE starts p_i at the clients' sample shares: build it with every client's training "
                "samples (Federation.client_samples)."
            )
        # L: the pull's last round (read before the engine makes hyperparameters tensors)
        self.last = int(training.rounds * self.hp.reg_share)

    def initial_cores(self, model):
        """c_1 … c_N at the start: independent draws, as the authors' Net() per client (client 0's is the run's
        model)."""
        n = self.training.clients
        cores = [model] + [self.net.fresh(self.training.seed * n + j) for j in range(1, n)]
        return {k: torch.stack([c[k] for c in cores]).to(model[k].device) for k in self.net.param_keys}

    def init_server(self, model):
        return {CORES + k: v for k, v in self.initial_cores(model).items()}

    def init_client(self, model):
        device, dtype = model[self.net.param_keys[0]].device, model[self.net.param_keys[0]].dtype
        samples = torch.tensor(self.training.federation.client_samples, dtype=dtype, device=device)
        p0 = samples / samples.sum()
        slots = {P: p0.clone(), P0: p0, OWN: torch.zeros_like(p0), REG: torch.zeros((), dtype=dtype, device=device)}
        mix = {
            MIX + k: torch.tensordot(p0, v, dims=1) for k, v in self.initial_cores(model).items()
        }  # w_i before it first trains
        return {**super().init_client(model), **slots, **mix}

    def pull(self, number: int):
        """λ(r) of round `number` (r = number − 1), as utils/losses.py get_reg_coef."""
        r, last = number - 1, self.last
        if not is_on(self.hp.mu) or r >= last:
            return 0.0
        shape = 0.001 ** (r / last) if self.hp.schedule == "exponential" else (math.cos(math.pi * r / last) + 1) / 2
        return self.hp.mu * shape

    def broadcast(self, client, server, at):
        n = self.training.clients
        own = (torch.arange(n, device=at.clients.device) == at.clients).to(client[P].dtype)
        cores = {k: server[CORES + k][at.clients] for k in self.net.param_keys}
        return {**client, **cores, OWN: own, REG: torch.zeros_like(client[REG]) + self.pull(at.number)}

    def mixed(self, state, server):
        """w_i = Σ_{j≠i} p_ij c_j (as received) + p_ii c_i (its own, training)."""
        p = state[P]
        others, own = p * (1 - state[OWN]), (p * state[OWN]).sum()
        return {k: torch.tensordot(others, server[CORES + k], dims=1) + own * state[k] for k in self.net.param_keys}

    def phases(self):
        t = self.training
        return [
            replace(
                self.sgd(("body.", "head.", P)), optimizer=SGD(t.lr, t.momentum, t.weight_decay, ((P, self.hp.lr_p),))
            )
        ]

    def loss(self, state, server, x, y):
        w = {**state, **self.mixed(state, server)}
        return F.cross_entropy(self.net.logits(w, x), y) + state[REG] * ((state[P] - state[P0]) ** 2).sum()

    def end_local(self, client, server, stats, at):
        return {MIX + k: v for k, v in self.mixed(client, server).items()}

    def upload(self, client, server):
        return {k: client[k] for k in self.net.param_keys}

    def aggregate(self, server, uploads, at):
        return {
            **server,
            **{CORES + k: server[CORES + k].index_put((at.clients,), uploads[k]) for k in self.net.param_keys},
        }

    def logits(self, state, server, x):
        return self.net.logits({**state, **{k: state[MIX + k] for k in self.net.param_keys}}, x)
