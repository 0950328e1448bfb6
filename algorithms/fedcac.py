"""FedCAC (Wu et al., ICCV 2023): cautiously aggressive collaboration; each client's critical parameters
are averaged only with clients whose critical parameters overlap enough.

Shared: the non-critical parameters (FedAvg's global model). Personal: each client's critical-parameter
mask, and its customized global model, which the server keeps for it.
Local loss: CE. After training, a parameter is critical where |Δθ ⊙ θ| (Δθ this round's change) is among
the top τ of its tensor (the paper's sensitivity, eq. 5).
Server: the global model, the sample-weighted mean of the cohort's models; for each client i of the
cohort the overlap with j, 1 − ‖m_i − m_j‖₁ / (2‖m_i‖₁), against the threshold
mean + (t/β)(max − mean) over the cohort's pairs (t the round: collaboration narrows as rounds go by),
and the customized model u_i, the plain mean of the trained models of i and the clients over it.
Broadcast: θ_i = m_i ⊙ u_i + (1 − m_i) ⊙ θ_global (before a client's first training, the global model).
Prediction: the client's model as the broadcast leaves it.

Sources: PFLlib clientcac.py / servercac.py and the authors' Fling code (fling/component/group/
fedcac_group.py) and configs (τ = 0.5, β = 100 on CIFAR-10 Dir(0.1); PFLlib leaves both to the command
line). A top-τ threshold that falls at or under 1e-10 moves to the smallest sensitivity above 1e-20, as
both codes do. A cohort of one client has no pairs (PFLlib divides by zero): its customized model is its own.

Round 1 as Fling: its first aggregation (its epoch 0) customizes with the threshold at 1/β, as every later
one with t/β; here the round t counts from 1, so the same. PFLlib's server skips customization at its
epoch 0 (`send_models` calls `get_customized_global_models` only from epoch 1), so after its first round
each client's critical parameters take its customized model as the client was built, the initial model,
and its threshold from then on is (epoch + 1)/β, again t/β: that form is `fedcac-pfllib`.
"""

from dataclasses import dataclass

import torch

from algorithms.base import Method, Unsupported
from algorithms.common import per_client, weighted_mean

START, MASK, CUSTOM = "cac.start.", "cac.mask.", "cac.custom."


@dataclass
class FedCACHparams:
    tau: float = 0.5  # τ, the share of each tensor's parameters that are critical (authors' CIFAR-10 config)
    beta: int = 100  # β, the rounds over which the collaboration threshold rises from the mean overlap to the largest

    def __post_init__(self):
        if not 0 < self.tau <= 1 or self.beta < 1:
            raise Unsupported(f"FedCAC needs 0 < tau <= 1 and beta >= 1 rounds; got tau={self.tau}, beta={self.beta}.")


def critical_mask(before: torch.Tensor, after: torch.Tensor, tau) -> torch.Tensor:
    """1 where |(after − before) ⊙ after| is among the top τ of the tensor (ties at the threshold included)."""
    c = ((after - before) * after).abs().flatten()
    ranked = torch.sort(c, descending=True).values
    k = torch.floor(torch.as_tensor(tau * c.numel())).long()  # int(τ n), from a tensor τ without reading it
    threshold = torch.where(k > 0, ranked.gather(0, (k - 1).clamp(min=0).view(1))[0], torch.inf)
    smallest = torch.where(c > 1e-20, c, torch.inf).min()
    threshold = torch.where((threshold <= 1e-10) & torch.isfinite(smallest), smallest, threshold)
    return (c >= threshold).to(after.dtype).view_as(after)


class FedCAC(Method):
    name = "fedcac"
    title = "FedCAC"
    origin = "roster"
    paper = "Wu et al., ICCV 2023"
    source = "PFLlib clientcac.py; the authors' configs"
    Hparams = FedCACHparams

    def init_client(self, model):
        keys = self.net.param_keys
        return {
            **super().init_client(model),
            **{START + k: model[k].clone() for k in keys},
            **{MASK + k: torch.zeros_like(model[k]) for k in keys},
        }

    def init_server(self, model):
        return {
            **super().init_server(model),
            **{CUSTOM + k: per_client(model[k], self.training.clients) for k in self.net.param_keys},
        }

    def broadcast(self, client, server, at):
        out = dict(client)
        for k in self.net.param_keys:
            mask = client[MASK + k]
            out[k] = mask * server[CUSTOM + k][at.clients] + (1 - mask) * server[k]
            out[START + k] = out[k]
        return out

    def end_local(self, client, server, stats, at):
        return {MASK + k: critical_mask(client[START + k], client[k], self.hp.tau) for k in self.net.param_keys}

    def upload(self, client, server):
        return {k: client[k] for k in self.net.param_keys} | {MASK + k: client[MASK + k] for k in self.net.param_keys}

    def aggregate(self, server, uploads, at):
        keys = self.net.param_keys
        out = {**server, **weighted_mean({k: uploads[k] for k in keys}, at.samples)}
        masks = torch.cat([uploads[MASK + k].flatten(1) for k in keys], 1)
        m = masks.shape[0]
        collaborate = torch.eye(m, dtype=masks.dtype, device=masks.device)
        if m > 1:
            overlap = 1 - torch.cdist(masks, masks, p=1) / (2 * masks.sum(1, keepdim=True))
            others = ~torch.eye(m, dtype=torch.bool, device=masks.device)
            mean, top = overlap[others].mean(), overlap[others].max()
            threshold = mean + at.number / self.hp.beta * (top - mean)
            collaborate = collaborate + ((overlap >= threshold) & others).to(masks.dtype)
        share = collaborate / collaborate.sum(1, keepdim=True)  # a plain mean over i and its collaborators
        for k in keys:
            out[CUSTOM + k] = server[CUSTOM + k].index_put((at.clients,), torch.tensordot(share, uploads[k], dims=1))
        return out


class FedCACPfllib(FedCAC):
    """PFLlib's form: the first round customizes nothing, so the critical parameters go back to the initial
    model (module docstring)."""

    name = "fedcac-pfllib"
    title = "FedCAC-PFLlib"
    source = "PFLlib clientcac.py / servercac.py"
    family = "fedcac"

    def aggregate(self, server, uploads, at):
        out = super().aggregate(server, uploads, at)
        if at.number == 1:  # each customized model stays the initial one that init_server gave every client
            out |= {k: v for k, v in server.items() if k.startswith(CUSTOM)}
        return out
