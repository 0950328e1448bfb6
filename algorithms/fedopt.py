"""FedAdam and FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2).

Shared: the whole backbone. Personal: nothing. Local training and upload: FedAvg's.
Server: the cohort's sample-weighted mean x̄ gives the pseudo-gradient Δ = x̄ − x; the server's
Adam (FedAdam) or Yogi (FedYogi) steps x along it: m ← β1 m + (1 − β1) Δ; v ← β2 v + (1 − β2) Δ²
(Adam) or v ← v − (1 − β2) Δ² sign(v − Δ²) (Yogi); x ← x + η m / (√v + τ), from m = 0, v = τ².
Prediction: the global model, as FedAvg.

Defaults: β1 = 0.9, β2 = 0.99 (the paper's §5, for every task); η = 0.01, τ = 1e-3 are a common
starting point (the paper tunes both per task; search_spaces/fedadam.yaml searches η over
[1e-3, 1] and τ over [1e-5, 1e-1]). Difference from Flower's strategies: v starts at τ² and
there is no bias correction, as Algorithm 2 writes it.
"""

from dataclasses import dataclass

from algorithms.base import Method
from algorithms.optimizers import Adam, Yogi


@dataclass
class FedOptHparams:
    server_lr: float = 0.01  # η, the server's step
    beta1: float = 0.9  # β1, the first moment's decay
    beta2: float = 0.99  # β2, the second moment's decay
    tau: float = 1e-3  # τ, the adaptivity: the larger, the closer to server SGD with momentum


class FedAdam(Method):
    name = "fedadam"
    title = "FedAdam"
    origin = "baseline"
    paper = "Reddi et al., ICLR 2021"
    source = "the paper's Algorithm 2"
    Hparams = FedOptHparams

    def server_optimizer(self):
        return Adam(self.hp.server_lr, self.hp.beta1, self.hp.beta2, self.hp.tau)


class FedYogi(FedAdam):
    name = "fedyogi"
    title = "FedYogi"
    paper = "Reddi et al., ICLR 2021"
    source = "the paper's Algorithm 2"

    def server_optimizer(self):
        return Yogi(self.hp.server_lr, self.hp.beta1, self.hp.beta2, self.hp.tau)
