"""Local-only: every client trains its own model on its own data; nothing is shared.

Shared: nothing. Personal: the whole backbone.
Local loss: cross-entropy. Upload: nothing. Prediction: the client's own model.
"""

from algorithms.base import Method


class Local(Method):
    name = "local"
    title = "Local-only"
    origin = "baseline"
    paper = "the tables' Local-only baseline"
    source = "PFLlib serverlocal.py"
    shared = ()
