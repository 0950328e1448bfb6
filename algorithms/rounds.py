"""What a round is to a method: the stretches of local training it declares (`Phase`), the optional passes it
takes (`Passes`), the `Round` a hook runs in, and the run's `Training` settings it builds on. algorithms/base.py's
`Method` is written in these terms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from algorithms.common import State
from algorithms.optimizers import SGD

# the label of a padded row in a kept partial batch: F.cross_entropy's ignore_index, left out of its mean
IGNORED = -100


@dataclass(frozen=True)
class Phase:
    """One stretch of local training over the client's training data."""

    trains: tuple[str, ...]  # prefixes of the client tensors this phase updates
    epochs: int
    optimizer: SGD
    loss: Callable[..., torch.Tensor] | None = None  # (state, server, x, y) -> scalar; None: the method's loss
    steps: int | None = None  # at most this many minibatch steps (None: every batch of every epoch)
    batch: int | None = None  # samples drawn per step (None: the run's batch size)
    # each step's gradient clipped to this norm first, as torch.nn.utils.clip_grad_norm_ (None: not clipped)
    clip: float | None = None
    # prefix groups clipped each on its own (one clip_grad_norm_ per model); (): all together
    clip_groups: tuple[tuple[str, ...], ...] = ()
    # each epoch draws from this share of the client's samples only, its last partial batch kept: the rows it lacks
    # carry label IGNORED, which the phase's loss must leave out as F.cross_entropy does (FedALA's rand_percent, whose
    # reference loader keeps the partial batch); None: every sample, in full batches
    share: float | None = None
    # applied to the trained tensors after each step, elementwise (FedALA's clamp to [0, 1])
    project: Callable[[State], State] | None = None

    def epoch_steps(self, samples: int, run_batch: int) -> int:
        """Batches of one epoch: the full ones (the last partial batch is dropped, as PFLlib does), or with a
        `share`, every batch of its samples, a partial one included."""
        batch, sampled = self.batch or run_batch, self.sampled(samples)
        return samples // batch if sampled is None else -(-sampled // batch)

    def sampled(self, samples: int) -> int | None:
        """Samples an epoch of a `share` phase draws (None: the full batches of all of them)."""
        return None if self.share is None else int(self.share * samples)

    def step_count(self, samples: int, run_batch: int) -> int:
        """The steps a client with `samples` training samples takes: every epoch's full batches, up to `steps`."""
        count = self.epochs * self.epoch_steps(samples, run_batch)
        return count if self.steps is None else min(count, self.steps)


@dataclass(frozen=True)
class Round:
    """What the engine tells a hook of the round it runs in. In a per-client hook (broadcast,
    begin_local, end_local) the tensors are that client's own, 0-dimensional; in `aggregate` they are
    the cohort's, in the order of the stacked uploads."""

    number: int  # the round being trained, from 1 (in broadcast: the round the client trains next)
    total: int  # the run's rounds
    clients: torch.Tensor  # client ids (long)
    samples: torch.Tensor  # training samples n_i (the run's float type)
    steps: torch.Tensor  # local steps of this round's training phases, n_i // batch per epoch (float)
    group: torch.Tensor | None = (
        # every client id this call of a hook runs for (the round's cohort, in order; in broadcast every client), the
        # same in each per-client call
        None
    )

    def client(self, i: int) -> Round:
        """The record as the cohort's i-th client sees it in a per-client hook."""
        return replace(self, clients=self.clients[i], samples=self.samples[i], steps=self.steps[i])


@dataclass(frozen=True)
class Passes:
    """The optional passes of a round a method takes; the engine runs these and no others."""

    begin_local: bool = False  # begin_local before local training
    end_local: bool = False  # end_local after it
    statistics_before: bool = False  # sums of `statistics` over the client's data, handed to begin_local
    statistics_after: bool = False  # ... with the trained model, handed to end_local
    trained_statistics: bool = False  # the pass after training sums `trained_statistics`, not `statistics` (FedAS)
    upload: bool = True  # clients upload and the server aggregates


@dataclass(frozen=True)
class Federation:
    """Facts of the whole federation that a method may read when it is built, as the reference code's servers read
    them at start; the engine fills them for every run, and most methods read none."""

    # the federation's training samples per class (FedGen's label draws, FedLC-PFLlib's one calibration vector)
    class_counts: tuple[int, ...] = ()
    # every client's training samples (APPLE's p_0)
    client_samples: tuple[int, ...] = ()
    # the largest share of clients in a round (join_ratio's upper end: FedCross's middleware count)
    participation_max: float = 1.0


@dataclass
class Training:
    """The run's settings a method builds on."""

    lr: float
    local_epochs: int
    batch_size: int
    num_classes: int
    clients: int  # the federation's size
    momentum: float = 0.0
    weight_decay: float = 0.0
    rounds: int = 1  # the run's communication rounds
    participation: float = 1.0  # the mean share of clients that train in a round (ρ)
    seed: int = 0  # the run's seed: what a method draws for itself (pFedHN's hypernetwork) is drawn from it
    federation: Federation = Federation()  # facts of the federation some methods read when built
