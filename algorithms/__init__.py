"""pFL methods, one module per method; each reads like its paper's algorithm box."""

from algorithms.base import Method, Net, Phase, Training
from algorithms.fedavg import FedAvg
from algorithms.fedavg_ft import FedAvgFT
from algorithms.fedper import FedPer
from algorithms.fedprox import FedProx
from algorithms.fedrep import FedRep
from algorithms.local import Local

METHODS: dict[str, type[Method]] = {m.name: m for m in (FedAvg, FedProx, Local, FedAvgFT, FedPer, FedRep)}

__all__ = ["METHODS", "Method", "Net", "Phase", "Training"]
