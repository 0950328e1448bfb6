"""pFedHN (Shamsian, Navon, Fetaya & Chechik, ICML 2021): a hypernetwork on the server generates
each client's model.

Server: the hypernetwork φ ("hn."): a client embedding v_i, an MLP of width `hidden` (a linear
layer from the embedding, then `layers` times ReLU and a linear layer, no ReLU after the last: the
reference CNNHyper with n_hidden = 3, four linear layers), and one linear head per backbone
tensor; and its optimizer's momentum.
Receiving: θ_i = h(v_i; φ) (BatchNorm statistics stay the client's own).
The round's clients train one after another (`Serial`, Algorithm 1): each receives θ_i from φ
as the previous client's step left it.
Local round: the local epochs on cross-entropy from θ_i.
Upload: the trained θ̃_i. Server, after each client: Δθ_i = θ_i − θ̃_i; the gradient
(∂θ_i/∂φ)ᵀ Δθ_i, its norm clipped at 50, and one SGD step of φ (momentum 0.9, weight decay
1e-3, step `hn_lr`), as the reference code (AvivSham/pFedHN, trainer.py) does.
Prediction: the generated θ_i.

Differences from the reference: the reference samples one client per step at random for a
number of steps; here each round takes every client of the cohort once, in id order, so one
round is one pass of the federation (FedPAC's Table 1 counts rounds so). Local training is
the run's protocol (the reference: 50 inner steps of SGD with momentum 0.9).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from algorithms.base import Method, Unsupported
from algorithms.capabilities import Serial
from algorithms.common import prefixed, substate
from algorithms.optimizers import SGD

HN, MOMENTUM = "hn.", "hn_momentum."
MAX_GRAD_NORM = 50.0  # the reference's clip of the hypernetwork's gradient
MAX_HEAD_WEIGHTS = 200_000_000  # 0.8 GB of heads, three times that with momentum and gradient


@dataclass
class PFedHNHparams:
    hn_lr: float = 0.01  # the hypernetwork's step (FedPAC's tuned value)
    hidden: int = 100  # width of the hypernetwork's hidden layers (the paper's)
    layers: int = 3  # hidden-to-hidden layers after the first (the reference's n_hidden)


class Hypernetwork(nn.Module):
    def __init__(self, clients: int, shapes: dict[str, torch.Size], hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(clients, 1 + clients // 4)  # the paper's embedding size
        hidden_layers = [m for _ in range(layers) for m in (nn.ReLU(), nn.Linear(hidden, hidden))]
        self.mlp = nn.Sequential(nn.Linear(1 + clients // 4, hidden), *hidden_layers)  # CNNHyper's mlp: no final ReLU
        self.heads = nn.ModuleDict({k.replace(".", "_"): nn.Linear(hidden, s.numel()) for k, s in shapes.items()})
        self.shapes = shapes

    def forward(self, index):
        h = self.mlp(self.embed(index))
        return {k: self.heads[k.replace(".", "_")](h).view(s) for k, s in self.shapes.items()}


class PFedHN(Serial, Method):
    name = "pfedhn"
    title = "pFedHN"
    origin = "baseline"
    paper = "Shamsian et al., ICML 2021"
    source = "AvivSham/pFedHN"
    Hparams = PFedHNHparams
    shared = ()

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        weights = self.hp.hidden * sum(p.numel() for p in net.module.parameters())
        if weights > MAX_HEAD_WEIGHTS:
            raise Unsupported(
                f"pFedHN's hypernetwork would need {weights / 1e6:.0f} million weights (one linear head of width "
                f"{self.hp.hidden} per tensor of this backbone); use a small backbone such as the papers' "
                "CNNs, or a smaller hidden."
            )
        with torch.device("meta"):  # its structure only: φ lives in the server's state, drawn in init_server
            self.hypernetwork = self.build()

    def build(self) -> Hypernetwork:
        shapes = {k: p.shape for k, p in self.net.module.named_parameters()}
        return Hypernetwork(self.training.clients, shapes, self.hp.hidden, self.hp.layers)

    def init_server(self, model):
        with torch.random.fork_rng(devices=[]):  # drawn on the CPU from the run's seed, every generator left as it was
            torch.random.default_generator.manual_seed(self.training.seed)
            phi = prefixed(self.build().to(model[self.net.param_keys[0]].device), HN)
        return {**phi, **{MOMENTUM + k: torch.zeros_like(v) for k, v in phi.items()}}

    def generate(self, server, index):
        return functional_call(self.hypernetwork, substate(server, HN), (index,))

    def broadcast(self, client, server, at):
        return {**client, **self.generate(server, at.clients)}

    def upload(self, client, server):
        return {k: client[k] for k in self.net.param_keys}

    def aggregate(self, server, uploads, at):
        phi = substate(server, HN)
        delta = {
            k: (vmap(lambda i: self.generate(server, i))(at.clients)[k] - uploads[k]).detach()
            for k in self.net.param_keys
        }

        def surrogate(p):  # its gradient: (∂θ_i/∂φ)ᵀ Δθ_i (one client: the engine runs pFedHN serially)
            generated = vmap(lambda i: functional_call(self.hypernetwork, p, (i,)))(at.clients)
            return sum((generated[k] * delta[k]).sum() for k in self.net.param_keys)

        g = grad(surrogate)(phi)
        norm = torch.sqrt(sum((v**2).sum() for v in g.values()))
        clip = torch.clamp(MAX_GRAD_NORM / (norm + 1e-6), max=1.0)  # torch.nn.utils.clip_grad_norm_(…, 50)
        phi = {k: v.clone() for k, v in phi.items()}
        momentum = {k: server[MOMENTUM + HN + k].clone() for k in phi}
        SGD(self.hp.hn_lr, momentum=0.9, weight_decay=1e-3).step(phi, {k: clip * v for k, v in g.items()}, momentum)
        return {**server, **{HN + k: v for k, v in phi.items()}, **{MOMENTUM + HN + k: v for k, v in momentum.items()}}
