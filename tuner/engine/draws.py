"""Every random draw of a run as a function of (seed, round, stream, client): the cohort, each
client's batch order, its augmentation seed, the keys of a method's noise. All are drawn on the
CPU and moved, nothing depends on call order, so both executors and every device draw alike and a
run restored from a checkpoint draws exactly what it would have."""

from __future__ import annotations

import numpy as np
import torch

# Streams: which part of a round a draw belongs to (a training phase p of a round is stream p).
FINE_TUNE_STREAM = 1000  # evaluation-time fine-tuning's phases, apart from training's
STATISTICS_STREAM = 2000  # statistics passes: 2000 before local training, 2001 after
TEST_STREAM, VAL_STREAM = 3000, 3001  # evaluation on each split
RECEIVE_STREAM = 4000  # the phases a client runs on receiving the server's model (Method.receive_phases)


def _mix(*ints: int) -> int:
    return int(np.random.SeedSequence([int(i) for i in ints]).generate_state(1)[0])


def sample_cohort(
    seed: int, rnd: int, num_clients: int, join_ratio: tuple[float, float], everyone: bool = False
) -> list[int]:
    if everyone:
        return list(range(num_clients))
    rng = np.random.default_rng(_mix(seed, rnd, 0xC0))
    lo, hi = join_ratio
    ratio = lo if lo == hi else rng.uniform(lo, hi)
    k = min(num_clients, max(1, int(round(ratio * num_clients))))
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


PADDED = -1  # a schedule's row index past the end of a kept partial batch


def batch_schedule(
    seed: int, rnd: int, stream: int, client: int, n: int, batch: int, epochs: int, take: int | None = None
) -> torch.Tensor:
    """(steps, batch) local row indices: a fresh permutation each epoch, of which the first `take` rows are used
    (default: the full batches, the last partial batch dropped, as PFLlib); a `take` that leaves a partial batch
    keeps it, its missing rows PADDED."""
    g = torch.Generator().manual_seed(_mix(seed, rnd, stream, client))
    take = n // batch * batch if take is None else take
    steps = -(-take // batch)
    rows = []
    for _ in range(epochs):
        epoch = torch.full((steps * batch,), PADDED, dtype=torch.long)
        epoch[:take] = torch.randperm(n, generator=g)[:take]
        rows.append(epoch.view(steps, batch))
    return torch.cat(rows) if rows else torch.empty(0, batch, dtype=torch.long)


def augment_seed(seed: int, rnd: int, stream: int, client: int) -> int:
    """The seed of a client's augmentation draws (crops and flips) in one phase of one round."""
    return _mix(seed, rnd, stream, client, 0xA6)


def draw_keys(seed: int, rnd: int, stream: int, client: int, count: int) -> torch.Tensor:
    """`count` 32-bit keys (int64) for a client's steps or batches in one stream of one round: what a
    drawing method's noise is made from (algorithms/common.py `uniform`)."""
    words = np.random.SeedSequence([seed, rnd, stream, client, 0xD7]).generate_state(max(count, 1))[:count]
    return torch.from_numpy(words.astype(np.int64))
