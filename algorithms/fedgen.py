"""FedGen (Zhu, Hong & Zhou, ICML 2021): a server-side generator of features distils the clients' heads back to them.

Shared: the whole backbone (FedAvg's global model). The server also trains a generator G(ε, y) of
features: Linear(noise + classes → hidden) → BatchNorm (batch statistics) → ReLU → Linear(→ feature size).
Local loss: CE(f(x), y) + CE(head(G(ε, ỹ)), ỹ), a batch of ỹ drawn from the federation's label
frequencies and ε ~ U[0, 1) (the generator fixed).
Upload: the trained model. Server: first `server_epochs` Adam steps on the generator, each on
CE(Σ_i w_i head_i(G(ε, ỹ)), ỹ) over the uploaded heads (w_i by samples); then the models' sample-weighted mean.
Prediction: the global model.

Sources: PFLlib clientgen.py / servergen.py (noise 512, hidden 512, 1000 server steps, generator lr
0.005, batch of the run's size; the paper's diversity loss and decaying weights are not in it, and
neither are they here). Differences: draws are keyed (labels and noise from the run's seed, round and
step: algorithms.common.uniform) where PFLlib draws from numpy's and torch's global generators; the
generator's batch norm normalizes by batch statistics on clients and server alike (PFLlib leaves it in
training mode throughout, so its running statistics are never read). A head with batch norm predicts
the generator's features on the server with its initial statistics (the server holds none).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, vmap

from algorithms.base import Method
from algorithms.common import DRAW_KEY, prefixed, uniform, weighted_mean

GEN, ADAM = "gen.", "gen_adam."


@dataclass
class FedGenHparams:
    noise_dim: int = 512  # ε's size (PFLlib's default)
    hidden_dim: int = 512  # the generator's hidden width (PFLlib's default)
    server_epochs: int = 1000  # generator steps a round (PFLlib's default)
    generator_lr: float = 0.005  # the generator's Adam learning rate (PFLlib's default)


class Generator(nn.Module):
    def __init__(self, noise: int, classes: int, hidden: int, features: int):
        super().__init__()
        self.fc1 = nn.Linear(noise + classes, hidden)
        self.bn = nn.BatchNorm1d(hidden, track_running_stats=False)  # batch statistics only (docstring)
        self.fc = nn.Linear(hidden, features)


class FedGen(Method):
    name = "fedgen"
    title = "FedGen"
    origin = "roster"
    paper = "Zhu et al., ICML 2021"
    source = "PFLlib clientgen.py"
    Hparams = FedGenHparams
    draws = True  # the generator's labels and noise in the local loss

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        device = next(net.module.parameters()).device
        self.generator = Generator(self.hp.noise_dim, training.num_classes, self.hp.hidden_dim, net.feature_dim).to(
            device
        )
        counts = torch.tensor(training.federation.class_counts or [1] * training.num_classes, dtype=torch.float64)
        # draws ỹ by the federation's label frequencies
        self.label_cdf = (counts.cumsum(0) / counts.sum())[:-1].tolist()

    def init_server(self, model):
        gen = prefixed(self.generator, GEN)
        adam = {ADAM + "m." + k: torch.zeros_like(v) for k, v in gen.items()} | {
            ADAM + "v." + k: torch.zeros_like(v) for k, v in gen.items()
        }
        return {**super().init_server(model), **gen, **adam, ADAM + "step": torch.zeros((), dtype=torch.float64)}

    def generate(self, gen, key, count):
        """G(ε, ỹ) for `count` draws of ỹ and ε from `key`; returns (features, ỹ)."""
        dtype = gen[GEN + "fc.weight"].dtype
        u = uniform(key, (count, 1 + self.hp.noise_dim), dtype)
        cdf = torch.tensor(self.label_cdf, dtype=dtype, device=u.device)
        labels = (u[:, :1] > cdf).sum(1)
        onehot = (labels[:, None] == torch.arange(self.training.num_classes, device=u.device)).to(dtype)
        h = F.linear(torch.cat([u[:, 1:], onehot], 1), gen[GEN + "fc1.weight"], gen[GEN + "fc1.bias"])
        h = F.relu(F.batch_norm(h, None, None, gen[GEN + "bn.weight"], gen[GEN + "bn.bias"], training=True))
        return F.linear(h, gen[GEN + "fc.weight"], gen[GEN + "fc.bias"]), labels

    def loss(self, state, server, x, y):
        z, labels = self.generate(server, state[DRAW_KEY], self.training.batch_size)
        return F.cross_entropy(self.net.logits(state, x), y) + F.cross_entropy(self.net.head(state, z), labels)

    def aggregate(self, server, uploads, at):
        heads = {k: v for k, v in uploads.items() if k.startswith("head.")}
        statistics = {
            k: v for k, v in self.net.initial_state().items() if k.startswith("head.") and self.net.is_buffer(k)
        }
        w = (at.samples / at.samples.sum()).to(uploads[self.net.param_keys[0]].dtype)
        self.net.module.eval()  # the uploaded heads predict as in evaluation (batch norm: initial statistics)

        def ensemble_ce(gen, key):
            z, labels = self.generate(gen, key, self.training.batch_size)
            logits = vmap(lambda head: self.net.head({**statistics, **head}, z))(heads)  # (cohort, B, classes)
            return F.cross_entropy(torch.tensordot(w, logits, dims=1), labels)

        gen = {k: v.clone() for k, v in server.items() if k.startswith(GEN)}
        m = {k: server[ADAM + "m." + k].clone() for k in gen}
        v = {k: server[ADAM + "v." + k].clone() for k in gen}
        step = server[ADAM + "step"].clone()
        base = (self.training.seed * 1_000_003 + at.number) * 10_007
        for t in range(self.hp.server_epochs):
            key = torch.tensor((base + t) % 2**32, dtype=torch.int64, device=w.device)
            g = grad(ensemble_ce)(gen, key)
            step += 1
            for k in gen:  # torch.optim.Adam (betas 0.9, 0.999; eps 1e-8), bias-corrected
                m[k] = 0.9 * m[k] + 0.1 * g[k]
                v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
                m_hat, v_hat = m[k] / (1 - 0.9**step), v[k] / (1 - 0.999**step)
                gen[k] = gen[k] - self.hp.generator_lr * m_hat / (v_hat.sqrt() + 1e-8)
        models = weighted_mean({k: uploads[k] for k in self.net.param_keys}, at.samples)
        adam = {ADAM + "m." + k: t for k, t in m.items()} | {ADAM + "v." + k: t for k, t in v.items()}
        return {**server, **models, **gen, **adam, ADAM + "step": step}
