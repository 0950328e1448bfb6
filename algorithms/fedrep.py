"""FedRep (Collins et al., 2021): personal head first, then the shared representation.

Shared: body. Personal: head.
Local training: `head_epochs` epochs of the head with the body frozen, then the local epochs
of the body with the head frozen; cross-entropy throughout.
Upload: the body. Server: sample-weighted mean. Prediction: global body + own head.
"""

from dataclasses import dataclass

from algorithms.base import Method


@dataclass
class FedRepHparams:
    head_epochs: int = 1  # epochs of head training before the body's epochs (PFLlib's default)


class FedRep(Method):
    name = "fedrep"
    title = "FedRep"
    origin = "baseline"
    paper = "Collins et al., ICML 2021"
    source = "PFLlib clientrep.py"
    Hparams = FedRepHparams
    shared = ("body.",)

    def phases(self):
        return [self.sgd(("head.",), self.hp.head_epochs), self.sgd(("body.",))]
