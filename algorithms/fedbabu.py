"""FedBABU (Oh, Kim & Yun, ICLR 2022): federate the body with the head frozen, fine-tune to personalize.

Shared: body. Head: kept at its random initialisation (the same on every client) during training.
Local loss: cross-entropy, body only.
Upload: the body. Server: sample-weighted mean.
Prediction: each client fine-tunes body and head for `ft_epochs` on its training data, then predicts.
With the head at its random initialisation one epoch under-fits it (8 rounds of FedPAC's Table 1
setting: 81.2 with 1 epoch, below FedAvg-FT's 84.0); PFLlib fine-tunes 10 epochs.
"""

from dataclasses import dataclass

from algorithms.base import Method


@dataclass
class FedBABUHparams:
    # fine-tuning epochs of the whole model before evaluation (PFLlib's fine_tuning_steps; FedPAC states none)
    ft_epochs: int = 10


class FedBABU(Method):
    name = "fedbabu"
    title = "FedBABU"
    origin = "baseline"
    paper = "Oh et al., ICLR 2022"
    source = "PFLlib clientbabu.py"
    Hparams = FedBABUHparams
    shared = ("body.",)

    def phases(self):
        return [self.sgd(("body.",))]  # the head never trains in federated rounds

    def eval_phases(self):
        return [self.sgd(("body.", "head."), self.hp.ft_epochs)]
