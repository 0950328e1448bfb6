"""FedAvg-FT: FedAvg, then each client fine-tunes the global model locally before it is evaluated.

Shared: the whole backbone. Personal: nothing kept between rounds.
Local loss: cross-entropy. Upload / server: as FedAvg.
Prediction: the global model after `ft_epochs` epochs of local SGD on the client's training data.
"""

from dataclasses import dataclass

from algorithms.base import Method


@dataclass
class FedAvgFTHparams:
    ft_epochs: int = 1  # local fine-tuning epochs before evaluation


class FedAvgFT(Method):
    name = "fedavg_ft"
    title = "FedAvg-FT"
    Hparams = FedAvgFTHparams

    def eval_phases(self):
        return [self.sgd(("body.", "head."), self.hp.ft_epochs)]
