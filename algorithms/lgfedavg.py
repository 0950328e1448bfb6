"""LG-FedAvg (Liang et al., 2020): local representations, a global head.

Shared: head. Personal: body (each client's own feature extractor, never uploaded).
Local loss: cross-entropy over the whole model.
Upload: the head. Server: sample-weighted mean. Prediction: own body + global head.
"""

from algorithms.base import Method


class LGFedAvg(Method):
    name = "lg-fedavg"
    title = "LG-FedAvg"
    origin = "baseline"
    paper = "Liang et al., 2020"
    source = "PFLlib clientlg.py"
    shared = ("head.",)
