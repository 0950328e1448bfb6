"""FedAvg-FT: FedAvg, then each client fine-tunes the global model locally before it is evaluated.

Shared: the whole backbone. Personal: nothing kept between rounds.
Local loss: cross-entropy. Upload / server: as FedAvg.
Prediction: the global model after `ft_epochs` epochs of local SGD on the client's training data,
by default as many as the run's local epochs: FedPAC's code reports FedAvg-FT as each client's
test accuracy after its local training from the received global model (JianXu95/FedPAC,
methods/fedavg.py local_training: acc2, after E = 5 epochs with the run's optimizer); under
PFLlib's protocol that is 1 epoch. Here the copy is fine-tuned from the model the server has
just aggregated, so it is one round further on than FedPAC's acc2 of the same round.
"""

from dataclasses import dataclass

from algorithms.base import Method


@dataclass
class FedAvgFTHparams:
    ft_epochs: int | None = None  # local fine-tuning epochs before evaluation; None: the run's local epochs


class FedAvgFT(Method):
    name = "fedavg_ft"
    title = "FedAvg-FT"
    origin = "baseline"
    paper = "FedPAC's FedAvg-FT baseline (Xu et al., ICLR 2023)"
    source = "JianXu95/FedPAC"
    Hparams = FedAvgFTHparams

    def eval_phases(self):
        return [self.sgd(("body.", "head."), self.hp.ft_epochs)]
