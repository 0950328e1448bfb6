"""Capabilities: what one method needs and no other, each opted into by naming it among the method's bases.

The core contract (algorithms/base.py's `Method`) is what every method has: its state, broadcast, phases, loss,
upload, aggregate and prediction, with the optional begin_local, end_local and statistics passes. A feature
that serves a single method lives here instead, as a mixin named first among the method's bases, so a reader
of the method sees at its class line what else the engine does for it, and the engine asks for the mixin,
never for an override:

    class FedFomo(HeldOut, Method): ...

| capability | what the engine does | method |
|:--|:--|:--|
| `HeldOut` | keeps `holdout` of each client's training split out of training, for `statistics` | FedFomo |
| `Serial` | trains a round's clients one after another, the server aggregating after each | pFedHN |
| `BatchedStatistics` | hands `statistics` whole batches of the run's batch size, in order | FedAS |
| `Carried` | keeps what a step's forward writes to the `carried` tensors for the next step | FedDBE |
| `Memory` | joins `memory` of each client's whole training split to its state for prediction | kNN-Per |
| `TrainsOnReceipt` | trains every client on `receive_phases` right after each broadcast of a trained model | FedALA |

A method may name several. Each is documented on its own class below.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from algorithms.common import State
from algorithms.rounds import Phase


class HeldOut:
    """A share of each client's training split is held out of local training: `statistics` sum over it
    instead of the training split (FedFomo's validation set, PFLlib's val_ratio)."""

    holdout: ClassVar[float]  # the share held out, in (0, 1)


class Serial:
    """The round's clients train one after another: each receives the server's state as the previous client left
    it, and the server aggregates that one client's upload before the next trains (pFedHN's Algorithm 1: a
    hypernetwork step after every client)."""

    unpackable: ClassVar[str] = "its clients train one after another, the server moving between them"


class BatchedStatistics:
    """Each call of `statistics` (and `trained_statistics`) holds whole batches of the run's batch size, in order,
    so a sum that is nonlinear in a batch is the reference's (FedAS's per-batch Fisher trace)."""


class Carried:
    """Client tensors that a training step's forward writes for the next step, as batch norm its running statistics
    (FedDBE's running mean of features): the engine hands each step a copy and keeps what it wrote."""

    carried: ClassVar[tuple[str, ...]]  # prefixes of those tensors

    def updated_in_place(self, key: str) -> bool:
        return super().updated_in_place(key) or key.startswith(self.carried)  # type: ignore[misc]


class Memory:
    """A datastore for prediction: before each evaluation, `memory` runs over each client's whole training split a
    batch at a time, and its rows (one per sample, dim 0) join the client's state that `logits` reads (kNN-Per)."""

    def memory(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> State:
        """Tensors of one row per sample of a batch (w: 0 for padding)."""
        raise NotImplementedError


class TrainsOnReceipt:
    """Every client trains right after each broadcast of a trained model (not the initial one), on its own training
    data, and keeps the result: what it predicts with and what it trains from next (FedALA's adaptive local
    aggregation)."""

    def receive_phases(self) -> list[Phase]:
        raise NotImplementedError
