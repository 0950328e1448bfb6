"""FedBABU (Oh, Kim & Yun, ICLR 2022): federate the body with the head frozen, fine-tune to personalize.

Shared: body. Head: kept at its random initialisation (the same on every client) during training.
Local loss: cross-entropy, body only.
Upload: the body. Server: sample-weighted mean.
Prediction: each client fine-tunes body and head for `ft_epochs` on its training data, then predicts.
"""

from dataclasses import dataclass

from algorithms.base import Method


@dataclass
class FedBABUHparams:
    ft_epochs: int = 1  # fine-tuning epochs of the whole model before evaluation


class FedBABU(Method):
    name = "fedbabu"
    title = "FedBABU"
    Hparams = FedBABUHparams
    shared = ("body.",)

    def phases(self):
        return [self.sgd(("body.",))]  # the head never trains in federated rounds

    def eval_phases(self):
        return [self.sgd(("body.", "head."), self.hp.ft_epochs)]
