"""FedPAC (Xu, Tong & Huang, ICLR 2023): feature alignment and classifier collaboration.

Shared: feature extractor θ ("body."). Personal: head φ_i ("head."), replaced each round by a
client-specific combination of the cohort's heads computed on the server.
ClientUpdate (Algorithm 1): θ_i ← θ; feature statistics μ_i, V_i before training (one pass);
1 epoch of the head (η_g = 0.1) with θ_i frozen (eq. 15); E epochs of θ_i on
CE + λ·(1/d)‖f(x) − c_y‖² (eqs. 3, 16; once global centroids exist) with φ_i frozen;
then class centroids ĉ_i (eq. 17). SGD with momentum 0.5 and weight decay 5e-4 (its protocol).
Upload: θ_i, φ_i, the statistics and the centroids.
Server: θ = sample-weighted mean (eq. 18); c_k = count-weighted mean of the ĉ_ik (eq. 19);
for each client i, α_i solves (46): min α^T (diag(V_j/n_j) + D^(i)) α over the simplex, with
Λ_f = I (A.5), V_j from eq. 44 and D^(i)_jj' = (h_i − h_j)·(h_i − h_j'), h_l = (P̂_l(y) μ_l,y)_y;
then φ_i ← Σ_j α_ij φ_j (eq. 4), sent back to client i.
Prediction: θ with the client's combined head.

Since Σα = 1, α^T D^(i) α = ‖h_i − Σ_j α_j h_j‖², so every client's objective is
α^T (G + diag(V/n)) α − 2 G_i^T α + const with G = H H^T the Gram matrix of the h_l: one shared
quadratic form, a linear term per client, and all of a round's QPs are one cvxpy problem.

Variants: combine="protoweights" (the replication report, eqs. 12-13: α_i = softmax_j of minus
the loss of client j's prototypes under client i's head); combine="none" keeps heads local;
lam=0 turns feature alignment off (Table 2: FedPAC-FA, FedPAC-CC, FedPAC-none).
`fedpac-official` zeroes combination weights below 1e-3 and renormalizes (the official code);
`fedpac-pfllib` zeroes them without renormalizing (PFLlib).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from algorithms.base import Method, Unsupported
from algorithms.common import cross_entropy, is_on, per_client, weighted_mean
from algorithms.variants import variant

COMBINE = ("qp", "protoweights", "none")
SMALL_WEIGHT = 1e-3  # the reference implementations' cut-off


@dataclass
class FedPACHparams:
    lam: float = 1.0  # λ, weight of the feature alignment (eq. 3)
    head_lr: float = 0.1  # η_g, the head's one epoch
    combine: str = "qp"  # qp (46) | protoweights (replication report) | none

    def __post_init__(self):
        if self.combine not in COMBINE:
            raise Unsupported(f"FedPAC's combine must be one of {', '.join(COMBINE)}, not '{self.combine}'.")


class SimplexQPs:
    """min_α α^T Q α − 2 g_i^T α over the simplex for every client i: one cvxpy problem per cohort size.

    Q is shared by all rows; row i of `linear` is g_i. Built once with parameters, re-solved each
    round; as quad_forms the solver sees a block-diagonal quadratic, which OSQP factors quickly.
    """

    SOLVER = "OSQP"
    TOLERANCE = 1e-7

    def __init__(self, m: int):
        import cvxpy as cp

        self.quadratic = cp.Parameter((m, m), PSD=True)
        self.linear = cp.Parameter((m, m))
        self.alpha = cp.Variable((m, m), nonneg=True)  # row i: client i's weights
        objective = sum(cp.quad_form(self.alpha[i], self.quadratic) for i in range(m)) - 2 * cp.sum(
            cp.multiply(self.linear, self.alpha)
        )
        self.problem = cp.Problem(cp.Minimize(objective), [cp.sum(self.alpha, axis=1) == 1])

    def solve(self, quadratic: np.ndarray, linear: np.ndarray) -> np.ndarray:
        scale = max(float(np.abs(quadratic).max()), 1e-12)  # the minimizer does not change with the scale
        eigval, eigvec = np.linalg.eigh(quadratic / scale)
        psd = (eigvec * np.clip(eigval, 0.0, None)) @ eigvec.T  # rounding can leave tiny negative eigenvalues
        self.quadratic.value = (psd + psd.T) / 2
        self.linear.value = linear / scale
        self.problem.solve(solver=self.SOLVER, eps_abs=self.TOLERANCE, eps_rel=self.TOLERANCE, max_iter=20000)
        alpha = np.clip(self.alpha.value, 0.0, None)
        return alpha / alpha.sum(1, keepdims=True)


class FedPAC(Method):
    name = "fedpac"
    title = "FedPAC"
    origin = "paper"
    paper = "Xu et al., ICLR 2023"
    source = "the paper"
    Hparams = FedPACHparams
    shared = ("body.",)
    # statistics μ_i, V_i with the received extractor before training, centroids ĉ_i with the trained one after

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        self.head_keys = net.keys(("head.",))
        self._qps: dict[int, SimplexQPs] = {}

    def init_client(self, model):
        c, k = self.training.num_classes, self.net.feature_dim
        device = model[self.head_keys[0]].device
        zeros = lambda *shape: torch.zeros(*shape, device=device)  # noqa: E731
        return {
            **super().init_client(model),
            "pac.h": zeros(c, k),
            "pac.v": zeros(()),
            "pac.sum": zeros(c, k),
            "pac.count": zeros(c),
        }

    def init_server(self, model):
        c, k = self.training.num_classes, self.net.feature_dim
        server = super().init_server(model)
        server["pac.centroids"] = torch.zeros(c, k, device=model[self.head_keys[0]].device)
        server["pac.has_centroids"] = torch.zeros((), device=server["pac.centroids"].device)
        for key in self.head_keys:  # the combined head waiting for each client
            server["pac.head." + key] = per_client(model[key], self.training.clients)
        return server

    def broadcast(self, client, server, at):
        out = super().broadcast(client, server, at)
        if self.hp.combine != "none":
            out |= {k: server["pac.head." + k][at.clients] for k in self.head_keys}
        return out

    # --- local round
    def statistics(self, state, server, x, y, w):
        f = self.net.features(state, x)
        onehot = (y[:, None] == torch.arange(self.training.num_classes, device=y.device)).to(f.dtype) * w[:, None]
        return {"count": onehot.sum(0), "sum": onehot.T @ f, "sqnorm": onehot.T @ (f**2).sum(1)}

    def begin_local(self, client, server, stats, at):
        count = stats["count"]
        prior = count / count.sum().clamp(min=1)  # P̂_i(y)
        mean = stats["sum"] / count.clamp(min=1)[:, None]  # μ_i,y
        second = stats["sqnorm"] / count.clamp(min=1)  # tr Λ_i,y = E‖f‖² given y
        v = (prior * second - prior**2 * (mean**2).sum(1)).sum()  # eq. 44
        return {"pac.h": prior[:, None] * mean, "pac.v": v}

    def end_local(self, client, server, stats, at):
        return {"pac.sum": stats["sum"], "pac.count": stats["count"]}  # centroids ĉ_i = sum / count (eq. 17)

    def phases(self):
        head = self.sgd(("head.",), epochs=1, lr=self.hp.head_lr, loss=cross_entropy(self.net))  # eq. 15
        body = self.sgd(("body.",))  # eq. 16
        return [head, body]

    def loss(self, state, server, x, y):
        f = self.net.features(state, x)
        loss = F.cross_entropy(self.net.head(state, f), y)
        if is_on(self.hp.lam):  # λ = 0: the ablation without feature alignment
            alignment = ((f - server["pac.centroids"][y]) ** 2).sum(1).mean() / f.shape[1]  # eq. 3
            loss = loss + self.hp.lam * server["pac.has_centroids"] * alignment
        return loss

    def upload(self, client, server):
        keys = self.net.keys(self.shared) + self.head_keys + ["pac.h", "pac.v", "pac.sum", "pac.count"]
        return {k: client[k] for k in keys}

    # --- server
    def aggregate(self, server, uploads, at):
        out = {**server, **weighted_mean({k: uploads[k] for k in self.net.keys(self.shared)}, at.samples)}  # eq. 18
        total = uploads["pac.count"].sum(0)
        centroids = uploads["pac.sum"].sum(0) / total.clamp(min=1)[:, None]  # eq. 19: Σ n_ik ĉ_ik / Σ n_ik
        out["pac.centroids"] = torch.where(total[:, None] > 0, centroids, server["pac.centroids"])
        out["pac.has_centroids"] = torch.ones_like(server["pac.has_centroids"])
        if self.hp.combine != "none":
            alpha = self.combination_weights(uploads, at.samples).to(at.samples.device)
            for k in self.head_keys:
                combined = torch.tensordot(alpha.to(uploads[k].dtype), uploads[k], dims=1)  # eq. 4
                out["pac.head." + k] = server["pac.head." + k].index_put((at.clients,), combined)
        return out

    def combination_weights(self, uploads, weights) -> torch.Tensor:
        """α (cohort x cohort): row i holds the weights of client i's combined head."""
        if self.hp.combine == "protoweights":
            return self.prototype_weights(uploads)
        h = uploads["pac.h"].flatten(1).double()
        gram = (h @ h.T).cpu().numpy()
        quadratic = gram + np.diag((uploads["pac.v"].double() / weights.double()).cpu().numpy())
        m = len(gram)
        if m not in self._qps:
            self._qps[m] = SimplexQPs(m)
        return self._settled(torch.from_numpy(self._qps[m].solve(quadratic, gram))).float()

    def _settled(self, alpha):
        return alpha  # the QP's solution as it is

    def prototype_weights(self, uploads) -> torch.Tensor:
        """Replication report, eqs. 12-13: α_ij ∝ exp(−loss of client j's prototypes under client i's head)."""
        count = uploads["pac.count"]  # (m, C)
        prototypes = uploads["pac.sum"] / count.clamp(min=1)[..., None]  # (m, C, K)
        m, c, k = prototypes.shape
        labels = torch.arange(c, device=count.device).repeat(m)
        present = (count > 0).to(prototypes.dtype)

        def losses_under(head: dict) -> torch.Tensor:  # one head, everybody's prototypes
            ce = F.cross_entropy(self.net.head(head, prototypes.reshape(m * c, k)), labels, reduction="none").view(m, c)
            return (ce * present).sum(1) / present.sum(1).clamp(min=1)

        loss = vmap(losses_under)({key: uploads[key] for key in self.head_keys})  # (i, j)
        return torch.softmax(-loss, dim=1)


class FedPACOfficial(FedPAC):
    """The official code's combination weights: those below 1e-3 zeroed, the rest renormalized."""

    name = "fedpac-official"
    title = "FedPAC-official"
    paper = "Xu et al., ICLR 2023"
    source = "JianXu95/FedPAC"
    family = "fedpac"

    def _settled(self, alpha):
        alpha = torch.where(alpha < SMALL_WEIGHT, torch.zeros_like(alpha), alpha)
        return alpha / alpha.sum(1, keepdim=True)


class FedPACPfllib(FedPAC):
    """PFLlib's combination weights: those below 1e-3 zeroed, not renormalized."""

    name = "fedpac-pfllib"
    title = "FedPAC-PFLlib"
    paper = "Xu et al., ICLR 2023"
    source = "PFLlib clientpac.py"
    family = "fedpac"

    def _settled(self, alpha):
        return torch.where(alpha < SMALL_WEIGHT, torch.zeros_like(alpha), alpha)


# Table 2 and the replication report
VARIANTS = [
    variant(FedPAC, "FedPAC-FA", combine="none"),
    variant(FedPAC, "FedPAC-CC", lam=0.0),
    variant(FedPAC, "FedPAC-none", combine="none", lam=0.0),
    variant(FedPAC, "FedPAC-protoweights", combine="protoweights"),
]
