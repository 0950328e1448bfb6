"""FedAvg (McMahan et al., 2017): one global model.

Shared: the whole backbone. Personal: nothing.
Local loss: cross-entropy. Upload: the whole model. Server: sample-weighted mean.
Prediction: the received global model (the papers report the global model for FedAvg).
"""

from algorithms.base import Method


class FedAvg(Method):
    name = "fedavg"
    title = "FedAvg"
    origin = "baseline"
    paper = "McMahan et al., AISTATS 2017"
    source = "PFLlib serveravg.py"
