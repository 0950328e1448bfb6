"""FedALA (Zhang et al., AAAI 2023): adaptive local aggregation of the received global model into the local one.

Shared: the whole backbone (FedAvg). Personal: the element-wise aggregation weights W of the higher layers
(the last `layer_idx` parameter tensors), starting at 1.
On receiving the global model θ_g (every client, every round, before it predicts or trains): the lower
layers take θ_g; the higher layers become θ + (θ_g − θ) ⊙ W, θ the client's own model's, with W learned
first on a share (`rand_percent`) of its training data:
  W ← clip(W − η ∇_W CE(θ + (θ_g − θ) ⊙ W), 0, 1)   (eq. 5; η = `eta`)
That blend becomes every client's own model, whether it trains this round or not (PFLlib's `send_models`
adapts every client); here it is written into θ at the next broadcast (`broadcast`), and a client that
trained has nothing left to blend in (`end_local`).
Local loss: CE from that model. Upload: the model. Server: sample-weighted mean.
Prediction: the adaptively aggregated model.

Sources: TsingZ0/FedALA and PFLlib utils/ALA.py and serverala.py (η = 1, rand_percent 80, layer_idx 2).
Differences: the reference learns W on a contiguous slice of `rand_percent` % at a random offset, in order;
here on as many samples of a keyed shuffle of the client's samples, its last partial batch kept as the
reference's loader keeps it (Phase.share; its padded rows are the split's first sample, another client's, with an
ignored label: they add nothing to the loss, but with batch norm they enter the batch's statistics). The pass
moves no BatchNorm statistic of the client's (it runs on copies of them, as the reference on a discarded copy
of the model). Its first adaptation runs epochs until the last ten losses vary by less than
0.1 (at least eleven); here every adaptation is one epoch (the engine runs a fixed number of steps). The
initial model is not adapted to (the engine runs receive phases from round 1's broadcast on), as the
reference skips its first iteration.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method, Unsupported
from algorithms.capabilities import TrainsOnReceipt
from algorithms.optimizers import SGD
from algorithms.rounds import Phase

WEIGHTS, RECEIVED = "ala.w.", "ala.g."


@dataclass
class FedALAHparams:
    eta: float = 1.0  # η, the weights' learning rate (the authors' default)
    rand_percent: int = 80  # the share of training data the weights learn on, in % (the authors' default)
    layer_idx: int = 2  # the last this many parameter tensors are aggregated adaptively (the authors' default)

    def __post_init__(self):
        if not 0 < self.rand_percent <= 100 or self.layer_idx < 1:
            raise Unsupported(
                f"FedALA needs 0 < rand_percent <= 100 and layer_idx >= 1; got {self.rand_percent} and "
                f"{self.layer_idx}."
            )


def unit_interval(weights):
    return {k: v.clamp(0.0, 1.0) for k, v in weights.items()}


class FedALA(TrainsOnReceipt, Method):
    name = "fedala"
    title = "FedALA"
    origin = "roster"
    paper = "Zhang et al., AAAI 2023"
    source = "TsingZ0/FedALA (= PFLlib utils/ALA.py)"
    Hparams = FedALAHparams

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        self.higher = net.param_keys[-min(self.hp.layer_idx, len(net.param_keys)) :]

    def init_client(self, model):
        model = super().init_client(model)
        return {
            **model,
            **{WEIGHTS + k: torch.ones_like(model[k]) for k in self.higher},
            **{RECEIVED + k: model[k].clone() for k in self.higher},
        }

    def broadcast(self, client, server, at):
        # what the last adaptation made the client's model: a client that trained since has it already
        own = self.mixed(client)
        lower = {k: v for k, v in server.items() if self.is_shared(k) and k not in self.higher}  # the lower layers: θ_g
        return {**client, **own, **lower, **{RECEIVED + k: server[k] for k in self.higher}}

    def mixed(self, state):
        """The higher layers θ + (θ_g − θ) ⊙ W."""
        return {k: state[k] + (state[RECEIVED + k] - state[k]) * state[WEIGHTS + k] for k in self.higher}

    def weights_loss(self, state, server, x, y):
        # on copies of the BatchNorm statistics, which the pass moves and leaves behind: the reference learns W on
        # a copy of the model that it then discards (ALA.py `model_t`), so the client's statistics stay as they were
        scratch = {k: v.clone() for k, v in state.items() if self.net.is_buffer(k)}
        return F.cross_entropy(self.net.logits({**state, **scratch, **self.mixed(state)}, x), y)

    def receive_phases(self):
        return [
            Phase(
                (WEIGHTS,),
                1,
                SGD(self.hp.eta),
                self.weights_loss,
                share=self.hp.rand_percent / 100,
                project=unit_interval,
            )
        ]

    def begin_local(self, client, server, stats, at):
        return self.mixed(client)

    def end_local(self, client, server, stats, at):
        return {
            RECEIVED + k: client[k] for k in self.higher
        }  # its model is its own now: nothing of θ_g left to blend in

    def logits(self, state, server, x):
        return self.net.logits({**state, **self.mixed(state)}, x)
