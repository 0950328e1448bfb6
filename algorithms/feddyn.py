"""FedDyn (Acar et al., ICLR 2021): dynamic regularization, so that the clients' stationary points agree with the
global one.

Shared: the whole backbone. Personal: g_k ("dyn.grad."), the client's last local gradient ∇L_k(θ_k^{t−1}),
zero at first. Server: θ and h ("dyn.h."), zero at first.
Local loss (Algorithm 1): L_k(θ) − ⟨g_k, θ⟩ + α/2 ‖θ − θ^{t−1}‖², θ^{t−1} the received model.
After training: g_k ← g_k − α (θ_k^t − θ^{t−1}).
Upload: θ_k^t. Server: h ← h − α/m Σ_{k∈P_t} (θ_k^t − θ^{t−1}) over the m clients of the federation,
θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h/α (plain means, as the paper).
Prediction: the global model, as FedAvg.

Sources: the paper's Algorithm 1; PFLlib clientdyn.py / serverdyn.py (the same updates, but the local
term is α/2 ‖θ − θ^{t−1}‖ unsquared; here the paper's square, which the g_k update assumes). Only
parameters take part; batch-norm statistics stay with each client.

The authors' code (alpemreacar/FedDyn, utils_methods.py `train_FedDyn`, utils_general.py
`train_feddyn_mdl`) runs the same dynamics in another bookkeeping (a client's accumulated θ_k − θ^{t−1}
for −g_k/α, their mean over the federation for −h/α) and differs in three ways, none of them here:
- α per client: α_k = α / (n_k / n̄), n̄ the federation's mean training size (`alpha_coef_adpt`), so a
  client with more data is held less;
- of the proximal gradient α_k (θ − θ^{t−1}), only α_k θ is SGD weight decay (`weight_decay=alpha_coef`),
  added after the gradient is clipped at norm 10 (`max_norm`); −α_k θ^{t−1} sits with the linear part inside
  the clipped loss (`loss_algo`: α_k ⟨θ, −θ^{t−1} + local_grad_vector⟩);
- the accuracies it reports are those of the plain mean of the round's client models (`avg_model`, "sel")
  and of the mean over every client's last model, taking part or not (`all_model`, "all"), not of the
  corrected model θ^t that the clients receive (`cld_model`); here, as the paper's Algorithm 1 and PFLlib,
  θ^t both trains and predicts.
A variant in that form would need a per-client weight decay outside the clip and a second server model;
not built.
"""

from dataclasses import dataclass

import torch.nn.functional as F

from algorithms.base import Method

GRAD = "dyn.grad."  # g_k, per parameter
H = "dyn.h."  # the server's h, per parameter


@dataclass
class FedDynHparams:
    alpha: float = 0.01  # α, the regularization's weight (paper's grid: 0.1, 0.01, 0.001)


class FedDyn(Method):
    name = "feddyn"
    title = "FedDyn"
    origin = "roster"
    paper = "Acar et al., ICLR 2021"
    source = "the paper's Algorithm 1; PFLlib clientdyn.py (alpemreacar/FedDyn's differences in the docstring)"
    Hparams = FedDynHparams

    def init_client(self, model):
        return {
            **super().init_client(model),
            **{GRAD + k: model[k].new_zeros(model[k].shape) for k in self.net.param_keys},
        }

    def init_server(self, model):
        return {
            **super().init_server(model),
            **{H + k: model[k].new_zeros(model[k].shape) for k in self.net.param_keys},
        }

    def loss(self, state, server, x, y):
        keys = self.net.param_keys
        linear = sum((state[GRAD + k] * state[k]).sum() for k in keys)
        proximal = sum(((state[k] - server[k]) ** 2).sum() for k in keys)
        return F.cross_entropy(self.net.logits(state, x), y) - linear + self.hp.alpha / 2 * proximal

    def end_local(self, client, server, stats, at):
        return {GRAD + k: client[GRAD + k] - self.hp.alpha * (client[k] - server[k]) for k in self.net.param_keys}

    def aggregate(self, server, uploads, at):
        keys = self.net.param_keys
        h = {
            H + k: server[H + k] - self.hp.alpha * (uploads[k] - server[k]).sum(0) / self.training.clients for k in keys
        }
        return {**server, **h, **{k: uploads[k].mean(0) - h[H + k] / self.hp.alpha for k in keys}}
