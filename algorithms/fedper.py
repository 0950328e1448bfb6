"""FedPer (Arivazhagan et al., 2019): shared feature extractor, personal head.

Shared: body (feature extractor). Personal: head.
Local loss: cross-entropy, body and head trained together.
Upload: the body. Server: sample-weighted mean of bodies.
Prediction: the global body with the client's own head.
"""

from algorithms.base import Method


class FedPer(Method):
    name = "fedper"
    title = "FedPer"
    origin = "baseline"
    paper = "Arivazhagan et al., 2019"
    source = "PFLlib clientper.py"
    shared = ("body.",)
