"""The executors: one training loop and one summing loop over a cohort whose client states are
stacked along dim 0, mapped one client at a time (`sequential`, the reference, which names the
hook, round and client of a failure in a method's code) or all at once with torch.func.vmap
(`vectorized`). Clients with fewer batches drop out of a step: the cohort is sorted by step
count, so the clients still active are always a prefix of the stack."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch.func import grad_and_value, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from algorithms.base import Method, Phase, Round, State
from tuner.data.augment import augment_draws, crop_flip
from tuner.data.federated import FederatedData, Split
from tuner.draws import augment_seed, batch_schedule
from tuner.errors import OutOfMemory

EXECUTORS = ("vectorized", "sequential")


@dataclass
class EngineSettings:
    """How the engine runs the method (the training settings themselves are the method's `Training`)."""

    seed: int = 0
    join_ratio: tuple[float, float] = (1.0, 1.0)  # fixed when equal, else drawn uniformly each round
    eval_gap: int = 1
    executor: str = "vectorized"
    cohort_chunk: int = 0  # clients per step; 0 = the whole cohort
    eval_batch: int = 256  # samples per client per evaluation step
    augment: bool = False  # random crop + flip of training images (tuner/data/augment.py)
    full_last_round: bool = False  # every client takes part in the last round (FedPAC §5)


def float_type(states: State) -> torch.dtype:
    """The run's float type (float32, or float64 for exact comparisons), read off its states."""
    return next(v.dtype for v in states.values() if v.is_floating_point())


def _stack(rows: list):
    """Per-client results (dicts or tuples of tensors) stacked along a new dim 0, as vmap returns them."""
    columns = zip(*[tree_flatten(r)[0] for r in rows])
    return tree_unflatten([torch.stack(c) for c in columns], tree_flatten(rows[0])[1])


class MethodFailed(RuntimeError):
    """A method's code raised; the sequential executor names the hook, the round and the client."""


class Executor:
    """Runs the method's per-client functions over a cohort whose states are stacked along dim 0."""

    def __init__(self, method: Method, data: FederatedData, settings: EngineSettings):
        self.method = method
        self.data = data
        self.settings = settings

    def mapped(self, fn: Callable, in_dims: tuple, hook: str, at: Round) -> Callable:
        """fn applied to each row of the arguments whose in_dim is 0, stacked; row i is client `at.clients[i]`
        (the active clients, a prefix of them, may be fewer)."""
        raise NotImplementedError

    def map(self, fn: Callable, states: State, server: State, *args, hook: str, at: Round):
        """fn(state_i, server, *args_i) for every client of the stack."""
        return self.mapped(fn, (0, None, *[0] * len(args)), hook, at)(states, server, *args)

    def chunked(self, n: int, run_chunk: Callable[[range], None]) -> None:
        """Run run_chunk over consecutive ranges of clients; on CUDA out-of-memory, halve the range and retry.

        run_chunk writes its results only once it has finished, so a failed attempt leaves no trace.
        """
        start = 0
        while start < n:
            size = self.settings.cohort_chunk or n
            part = range(start, min(start + size, n))
            try:
                run_chunk(part)
            except torch.cuda.OutOfMemoryError:
                if size == 1:
                    raise OutOfMemory(
                        "CUDA ran out of memory training one client at a time; use a smaller backbone, batch_size or eval_batch, or a GPU with more memory."
                    ) from None
                self.settings.cohort_chunk = max(1, size // 2)  # kept for the rest of the run
                torch.cuda.empty_cache()
                continue
            start = part.stop

    def _step_loss(self, phase: Phase) -> Callable:
        loss = phase.loss or self.method.loss

        def f(params: State, rest: State, server: State, x, y):
            return loss({**rest, **params}, server, x, y)

        return grad_and_value(f)

    def _inputs(self, idx: torch.Tensor, draws: torch.Tensor | None) -> torch.Tensor:
        """Training inputs of the rows idx: augmented on the stored pixels, then decoded."""
        x = self.data.train.x[idx]
        return self.data.decode(x if draws is None else crop_flip(x, draws))

    def _trainable(self, phase: Phase, state: State) -> list[str]:
        """A phase trains every floating tensor under its prefixes except BatchNorm statistics."""
        net = self.method.net
        return [k for k, v in state.items() if k.startswith(phase.trains) and not net.is_buffer(k) and v.is_floating_point()]

    def train(self, phases: list[Phase], cohort: State, server: State, at: Round, stream_base: int) -> torch.Tensor:
        """Train the stacked cohort in place, a step of every active client at a time; returns each client's
        mean minibatch loss."""
        train, s, run_batch = self.data.train, self.settings, self.method.training.batch_size
        device = train.y.device
        ids = at.clients.tolist()
        losses = torch.zeros(len(ids), dtype=torch.float64, device=device)
        steps = torch.zeros(len(ids), device=device)
        self.method.net.module.train()
        for p_idx, phase in enumerate(phases):
            grad_fn = self._step_loss(phase)
            keys = self._trainable(phase, cohort)
            batch = phase.batch or run_batch
            stream = stream_base + p_idx
            scheds = [batch_schedule(s.seed, at.number, stream, i, train.counts[i], batch, phase.epochs)[: phase.steps] for i in ids]
            draws = [augment_draws(augment_seed(s.seed, at.number, stream, i), *q.shape) for i, q in zip(ids, scheds)] if s.augment else None

            def run_chunk(part: range) -> None:
                order = sorted(part, key=lambda j: -len(scheds[j]))  # most steps first
                n_steps = [len(scheds[j]) for j in order]
                if n_steps[0] == 0:
                    return
                index = torch.zeros(len(order), n_steps[0], batch, dtype=torch.long)
                aug = None if draws is None else torch.zeros(*index.shape, 3, dtype=torch.long)
                for r, j in enumerate(order):
                    index[r, : n_steps[r]] = scheds[j] + train.offsets[ids[j]]
                    if aug is not None:
                        aug[r, : n_steps[r]] = draws[j]
                index = index.to(device)  # the chunk's whole schedule in one copy
                aug = None if aug is None else aug.to(device)
                active = [sum(1 for c in n_steps if c > t) for t in range(n_steps[0])]
                order_t = torch.tensor(order, device=device)
                clients = at.clients[order_t]
                params = {k: cohort[k][order_t].clone() for k in keys}
                rest = {k: v[order_t].clone() for k, v in cohort.items() if k not in params}
                opt_state = phase.optimizer.init(params)
                chunk_loss = torch.zeros(len(order), dtype=torch.float64, device=device)
                step = self.mapped(grad_fn, (0, 0, None, 0, 0), "loss", replace(at, clients=clients))  # row i: clients[i]
                for t, a in enumerate(active):
                    idx = index[:a, t]
                    x = self._inputs(idx, None if aug is None else aug[:a, t])
                    p_a = {k: v[:a] for k, v in params.items()}
                    g, loss = step(p_a, {k: v[:a] for k, v in rest.items()}, server, x, train.y[idx])
                    phase.optimizer.step(p_a, g, {k: v[:a] for k, v in opt_state.items()})
                    chunk_loss[:a] += loss.detach()  # no host sync per step
                for k, v in {**params, **rest}.items():
                    cohort[k][order_t] = v
                losses[order_t] += chunk_loss
                steps[order_t] += torch.tensor(n_steps, dtype=steps.dtype, device=device)

            self.chunked(len(ids), run_chunk)
        return (losses / steps.clamp(min=1)).cpu()

    @torch.no_grad()
    def sum_over(self, fn: Callable, states: State, server: State, split: Split, hook: str, at: Round) -> State:
        """Sum fn(state, server, x, y, w) over each client's samples of a split, eval_batch at a time;
        padded samples carry w = 0."""
        self.method.net.module.eval()
        device = split.y.device
        ids = at.clients.tolist()
        results: dict[int, State] = {}

        def run_chunk(part: range) -> None:
            rows = sorted(part, key=lambda j: -split.counts[ids[j]])  # longest first: active clients are a prefix
            rows_t = torch.tensor(rows, device=device)
            clients = at.clients[rows_t]
            state = {k: v[rows_t] for k, v in states.items()}
            counts = [split.counts[ids[j]] for j in rows]
            width = min(self.settings.eval_batch, max(counts[0], 1))  # no wider than the largest client: padding costs
            summed = self.mapped(fn, (0, None, 0, 0, 0), hook, replace(at, clients=clients))  # row i: clients[i]
            total: State = {}
            for start in range(0, max(counts[0], 1), width):
                a = max(1, sum(1 for c in counts if c > start))
                index, mask = split.padded_index(clients[:a], start, width)
                part_out = summed({k: v[:a] for k, v in state.items()}, server, self.data.decode(split.x[index]), split.y[index],
                                  mask.to(float_type(states)))  # fmt: skip
                if not total:
                    total = {k: torch.zeros(len(rows), *v.shape[1:], dtype=v.dtype, device=device) for k, v in part_out.items()}
                for k, v in part_out.items():
                    total[k][:a] += v
            for r, j in enumerate(rows):
                results[j] = {k: v[r] for k, v in total.items()}

        self.chunked(len(ids), run_chunk)
        return _stack([results[j] for j in range(len(ids))])


class SequentialExecutor(Executor):
    """The reference: one client at a time, no vmap; a failure in the method names where it happened."""

    def mapped(self, fn, in_dims, hook, at):
        def one_by_one(*args):
            rows = []
            n = tree_flatten(next(a for a, d in zip(args, in_dims) if d is not None))[0][0].shape[0]
            for i in range(n):
                mine = [a if d is None else tree_map(lambda t: t[i], a) for a, d in zip(args, in_dims)]  # views: in-place updates land
                try:
                    rows.append(fn(*mine))
                except Exception as e:  # the client's id is read only here: no host sync per step
                    client = int(at.clients[i])
                    raise MethodFailed(f"{type(self.method).__name__}.{hook} failed in round {at.number} for client {client}: {e}") from e
            return _stack(rows)

        return one_by_one


class VectorizedExecutor(Executor):
    """The whole cohort at once."""

    def mapped(self, fn, in_dims, hook, at):
        return vmap(fn, in_dims=in_dims, randomness="different")


def make_executor(name: str, method: Method, data: FederatedData, settings: EngineSettings) -> Executor:
    return {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}[name](method, data, settings)
