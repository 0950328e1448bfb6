"""A phase's round for a cohort, drawn before it trains: each client's (steps, batch) rows of its samples, its
augmentation draws and its noise keys, all keyed by (seed, round, stream, client) (tuner/draws.py), so every
executor and engine trains on the same draws."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.rounds import Phase, Round
from tuner.data.augment import augment_draws
from tuner.draws import augment_seed, batch_schedule, draw_keys


def phase_schedule(
    phase: Phase, seed: int, rnd: int, stream: int, client: int, samples: int, batch: int
) -> torch.Tensor:
    """A phase's (steps, batch) rows of a client's samples: each epoch a fresh permutation in full batches, or its
    first `share` of samples with the last partial batch kept (padded); at most `steps`."""
    return batch_schedule(seed, rnd, stream, client, samples, batch, phase.epochs, phase.sampled(samples))[
        : phase.steps
    ]


@dataclass
class PhasePlan:
    """A phase's round for a cohort (rows in the cohort's order): each client's (steps, batch) sample rows, and its
    augmentation draws and noise keys where the run draws them."""

    phase: Phase
    number: int  # the phase's place in the round: its optimizer buffers' name
    keys: list[str]  # the state keys it trains
    batch: int
    scheds: list[torch.Tensor]
    draws: list[torch.Tensor] | None
    noise: list[torch.Tensor] | None


def plan_phase(
    phase: Phase, number: int, keys: list[str], batch: int, at: Round, stream: int, settings, counts, draws: bool
) -> PhasePlan:
    """A phase's round for the cohort `at.clients`: each client's batch rows, its augmentation draws where the run
    augments (`settings.augment`) and its noise keys where the method draws (`draws`)."""
    seed, ids = settings.seed, at.clients.tolist()
    scheds = [phase_schedule(phase, seed, at.number, stream, i, counts[i], batch) for i in ids]
    pairs = list(zip(ids, scheds, strict=True))
    augmented = (
        [augment_draws(augment_seed(seed, at.number, stream, i), *q.shape) for i, q in pairs]
        if settings.augment
        else None
    )
    noise = [draw_keys(seed, at.number, stream, i, len(q)) for i, q in pairs] if draws else None
    return PhasePlan(phase, number, keys, batch, scheds, augmented, noise)
