"""A phase's round for a cohort, drawn before it trains: each client's (steps, batch) rows of its samples, its
augmentation draws and its noise keys, all keyed by (seed, round, stream, client) (tuner/engine/draws.py), so every
executor and engine trains on the same draws."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.rounds import Phase, Round
from tuner.data.augment import augment_draws
from tuner.engine.draws import PADDED, augment_seed, batch_schedule, draw_keys


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
    phase: Phase,
    number: int,
    keys: list[str],
    batch: int,
    at: Round,
    stream: int,
    draw_ids: list[tuple[int, int]],
    augment: bool,
    counts: list[int],
    draws: bool,
) -> PhasePlan:
    """A phase's round for the cohort `at.clients`: each client's batch rows, its augmentation draws where the run
    augments (`augment`) and its noise keys where the method draws (`draws`), all drawn from each client's
    (seed, client) in `draw_ids` (its run's seed and its own id: tuner/engine/executors.py `Executor.draw_id`)."""
    rows = at.clients.tolist()
    scheds = [
        phase_schedule(phase, s, at.number, stream, i, counts[r], batch)
        for r, (s, i) in zip(rows, draw_ids, strict=True)
    ]
    pairs = list(zip(draw_ids, scheds, strict=True))
    augmented = (
        [augment_draws(augment_seed(s, at.number, stream, i), *q.shape) for (s, i), q in pairs] if augment else None
    )
    noise = [draw_keys(s, at.number, stream, i, len(q)) for (s, i), q in pairs] if draws else None
    return PhasePlan(phase, number, keys, batch, scheds, augmented, noise)


def chunk_schedule(plan: PhasePlan, order: list[int], offsets: list[int], block: int, device: torch.device) -> tuple:
    """A chunk's whole schedule on the device, step-major, in one copy each: its batches' rows of the split
    (steps, rows, batch), augmentation draws (..., 3) and noise keys (steps, rows) where the run has them, and
    whether each row trains at each step (`live`); as many steps as whole blocks of `block` hold. Row r is client
    order[r] of the plan (offsets: where each of the plan's clients begins in the split). Past a client's last
    step its rows stay 0, which a row not live reads and discards."""
    n_steps = [len(plan.scheds[j]) for j in order]
    length = -(-max(n_steps) // block) * block
    index = torch.zeros(length, len(order), plan.batch, dtype=torch.long)
    aug = None if plan.draws is None else torch.zeros(*index.shape, 3, dtype=torch.long)
    key = None if plan.noise is None else torch.zeros(length, len(order), dtype=torch.long)
    for r, j in enumerate(order):
        index[: n_steps[r], r] = torch.where(plan.scheds[j] == PADDED, PADDED, plan.scheds[j] + offsets[j])
        if aug is not None and plan.draws is not None:
            aug[: n_steps[r], r] = plan.draws[j]
        if key is not None and plan.noise is not None:
            key[: n_steps[r], r] = plan.noise[j]
    live = torch.arange(length)[:, None] < torch.tensor(n_steps)
    return tuple(None if t is None else t.to(device) for t in (index, aug, key, live))
