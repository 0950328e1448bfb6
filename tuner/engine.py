"""The federated engine, written once for every method.

One round: sample a cohort, train it locally (the method's phases), upload, aggregate,
broadcast the result to every client, and evaluate every client's personalized model.

Client states are stacked along dim 0. One training loop and one summing loop serve both
executors, which differ only in how a per-client function is mapped over the stack:
- `sequential`: one client after another with plain torch.func: the reference, and the one
  that names the hook, round and client of a failure in a method's code;
- `vectorized`: the whole cohort at once with torch.func.vmap.
Clients with fewer batches drop out of a step: the cohort is sorted by step count, so the
clients still active are always a prefix of the stack.

All randomness (cohort sampling, batch order) is a function of (seed, round, stream, client),
so a saved state (round, server and client tensors, history) restores a run exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from algorithms.base import Method, Phase, Round, State
from tuner.data.augment import augment_draws, crop_flip
from tuner.data.federated import FederatedData, Split
from tuner.errors import DivergedError

EXECUTORS = ("vectorized", "sequential")
FINE_TUNE_STREAM = 1000  # batch-order stream of evaluation-time fine-tuning, apart from training's phases


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


def _mix(*ints: int) -> int:
    return int(np.random.SeedSequence([int(i) for i in ints]).generate_state(1)[0])


def sample_cohort(seed: int, rnd: int, num_clients: int, join_ratio: tuple[float, float], everyone: bool = False) -> list[int]:
    if everyone:
        return list(range(num_clients))
    rng = np.random.default_rng(_mix(seed, rnd, 0xC0))
    lo, hi = join_ratio
    ratio = lo if lo == hi else rng.uniform(lo, hi)
    k = min(num_clients, max(1, int(round(ratio * num_clients))))
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


def batch_schedule(seed: int, rnd: int, stream: int, client: int, n: int, batch: int, epochs: int) -> torch.Tensor:
    """(steps, batch) local row indices: a fresh permutation each epoch, last partial batch dropped (as PFLlib)."""
    g = torch.Generator().manual_seed(_mix(seed, rnd, stream, client))
    usable = n // batch * batch
    rows = [torch.randperm(n, generator=g)[:usable].view(-1, batch) for _ in range(epochs)]
    return torch.cat(rows) if rows else torch.empty(0, batch, dtype=torch.long)


def _float_type(states: State) -> torch.dtype:
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
        """fn applied to each client's slice of the arguments whose in_dim is 0 (clients `at.clients`), stacked."""
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
                    raise
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
            draws = [augment_draws(_mix(s.seed, at.number, stream, i, 0xA6), *q.shape) for i, q in zip(ids, scheds)] if s.augment else None

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
                for t, a in enumerate(active):
                    idx = index[:a, t]
                    x = self._inputs(idx, None if aug is None else aug[:a, t])
                    p_a = {k: v[:a] for k, v in params.items()}
                    step = self.mapped(grad_fn, (0, 0, None, 0, 0), "loss", replace(at, clients=clients[:a]))
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
            total: State = {}
            for start in range(0, max(counts[0], 1), width):
                a = max(1, sum(1 for c in counts if c > start))
                index, mask = split.padded_index(clients[:a], start, width)
                summed = self.mapped(fn, (0, None, 0, 0, 0), hook, replace(at, clients=clients[:a]))
                part_out = summed({k: v[:a] for k, v in state.items()}, server, self.data.decode(split.x[index]), split.y[index],
                                  mask.to(_float_type(states)))  # fmt: skip
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
            for i, client in enumerate(at.clients.tolist()):
                mine = [a if d is None else tree_map(lambda t: t[i], a) for a, d in zip(args, in_dims)]  # views: in-place updates land
                try:
                    rows.append(fn(*mine))
                except Exception as e:
                    raise MethodFailed(f"{type(self.method).__name__}.{hook} failed in round {at.number} for client {client}: {e}") from e
            return _stack(rows)

        return one_by_one


class VectorizedExecutor(Executor):
    """The whole cohort at once."""

    def mapped(self, fn, in_dims, hook, at):
        return vmap(fn, in_dims=in_dims, randomness="different")


def make_executor(name: str, method: Method, data: FederatedData, settings: EngineSettings) -> Executor:
    return {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}[name](method, data, settings)


def split_metrics(correct: torch.Tensor, loss_sum: torch.Tensor, counts: list[int]) -> dict[str, float]:
    """The papers' accuracy (sum correct / sum samples) and fairness across clients."""
    n = torch.tensor(counts, dtype=torch.float64)
    has = n > 0
    acc_i = correct.double()[has] / n[has]
    mean = acc_i.mean().item()
    std = acc_i.std(unbiased=False).item()
    return {
        "acc": correct.sum().item() / n.sum().item(),
        "acc_client_mean": mean,
        "acc_std": std,
        "acc_cv": std / mean if mean > 0 else math.nan,
        "loss": loss_sum.sum().item() / n.sum().item(),
    }


class Simulation:
    """A whole federated run: its state, one round at a time."""

    def __init__(self, method: Method, data: FederatedData, settings: EngineSettings):
        if method.holdout:
            data = data.hold_out(method.holdout)
        self.method, self.data, self.settings = method, data, settings
        self.executor = make_executor(settings.executor, method, data, settings)
        model = method.net.initial_state()
        torch.manual_seed(settings.seed)  # the run's noise stream (FedCP's Gumbel option); saved with the state
        n = data.num_clients
        dtype = next(v.dtype for v in model.values() if v.is_floating_point())
        as_model = lambda d: {k: v.to(dtype) if v.is_floating_point() else v for k, v in d.items()}  # noqa: E731  method modules are float32
        self.server = as_model(method.init_server(model))
        client = as_model(method.init_client(model))
        self.clients = {k: v.unsqueeze(0).repeat(n, *[1] * v.dim()).contiguous() for k, v in client.items()}
        self.round = 0
        self._broadcast(list(range(n)))
        self.history: list[dict] = []
        self.best_acc = -math.inf

    @property
    def device(self) -> torch.device:
        return next(iter(self.clients.values())).device

    def at(self, number: int, ids: list[int]) -> Round:
        """The Round record of clients `ids` in round `number`."""
        counts = [self.data.train.counts[i] for i in ids]
        steps = [sum(p.step_count(c, self.method.training.batch_size) for p in self.method.phases()) for c in counts]
        as_float = lambda v: torch.tensor(v, dtype=_float_type(self.clients), device=self.device)  # noqa: E731
        return Round(number, self.method.training.rounds, torch.tensor(ids, device=self.device), as_float(counts), as_float(steps))

    def _per_client(self, hook: Callable, name: str, states: State, at: Round, *args) -> State:
        """A per-client hook(state, server, *args, at_i) over the stack, each client getting its own Round."""

        def with_round(state, server, *rest):
            *own, clients, samples, steps = rest
            return hook(state, server, *own, replace(at, clients=clients, samples=samples, steps=steps))

        return self.executor.map(with_round, states, self.server, *args, at.clients, at.samples, at.steps, hook=name, at=at)

    def _broadcast(self, ids: list[int]) -> None:
        """Clients `ids` take what they need from the server for the round they train next."""
        at = self.at(self.round + 1, ids)
        out = self._per_client(self.method.broadcast, "broadcast", {k: v[at.clients] for k, v in self.clients.items()}, at)
        for k, v in out.items():
            self.clients[k][at.clients] = v

    def _local_hook(self, hook: Callable, name: str, with_statistics: bool, cohort: State, at: Round) -> State:
        """begin_local or end_local over the cohort, after a statistics pass where the method declares one."""
        stats = {}
        if with_statistics:
            split = self.data.holdout or self.data.train
            stats = self.executor.sum_over(self.method.statistics, cohort, self.server, split, "statistics", at)
        return {**cohort, **self._per_client(hook, name, cohort, at, stats)}

    def _accuracy(self, state, server, x, y, w):
        out = self.method.logits(state, server, x)
        hits = (out.argmax(-1) == y).to(w.dtype)
        return {"correct": (hits * w).sum(), "loss": (F.cross_entropy(out, y, reduction="none") * w).sum()}

    @torch.no_grad()
    def _memory(self, clients: State, at: Round) -> State:
        """The method's memory of every client's whole training split, padded to the largest client:
        computed eval_batch samples at a time (a whole split at once can outgrow any memory) and
        joined along the sample axis."""
        train = self.data.train
        self.method.net.module.eval()
        parts, longest = [], max(max(train.counts), 1)
        for start in range(0, longest, self.settings.eval_batch):
            index, mask = train.padded_index(at.clients, start, self.settings.eval_batch)
            x, y, w = self.data.decode(train.x[index]), train.y[index], mask.to(_float_type(clients))
            parts.append(self.executor.map(self.method.memory, clients, self.server, x, y, w, hook="memory", at=at))
        return {k: torch.cat([p[k] for p in parts], 1)[:, :longest] for k in parts[0]}

    def evaluate(self) -> dict[str, float]:
        clients = self.clients
        at = self.at(self.round, list(range(self.data.num_clients)))
        if self.method.eval_phases():  # fine-tune copies of every client first
            clients = {k: v.clone() for k, v in clients.items()}
            self.executor.train(self.method.eval_phases(), clients, self.server, at, FINE_TUNE_STREAM)
        if self.method.passes.memory:
            clients = {**clients, **self._memory(clients, at)}
        row = {}
        for prefix, split in (("", self.data.test), ("val_", self.data.val)):
            if split is None:
                continue
            sums = self.executor.sum_over(self._accuracy, clients, self.server, split, "logits", at)
            m = split_metrics(sums["correct"].cpu(), sums["loss"].cpu().double(), split.counts)
            if prefix:
                row |= {"val_acc": m["acc"], "val_loss": m["loss"]}
            else:
                row |= {k: m[k] for k in ("acc", "acc_client_mean", "acc_std", "acc_cv")} | {"test_loss": m["loss"]}
        return row

    def _local_round(self, at: Round) -> torch.Tensor:
        """Train, upload and aggregate one group of clients; returns each client's mean training loss."""
        m, passes = self.method, self.method.passes
        cohort = {k: v[at.clients].clone() for k, v in self.clients.items()}
        if passes.begin_local:
            cohort = self._local_hook(m.begin_local, "begin_local", passes.statistics_before, cohort, at)
        client_loss = self.executor.train(m.phases(), cohort, self.server, at, 0)
        if passes.end_local:
            cohort = self._local_hook(m.end_local, "end_local", passes.statistics_after, cohort, at)
        for k, v in cohort.items():
            self.clients[k][at.clients] = v
        if passes.upload:
            uploads = self.executor.map(m.upload, cohort, self.server, hook="upload", at=at)
            self.server = m.aggregate(self.server, uploads, at)
        return client_loss

    def step(self) -> dict:
        """Run one round and return its metrics row."""
        t0 = time.perf_counter()
        rnd = self.round + 1
        s = self.settings
        ids = sample_cohort(s.seed, rnd, self.data.num_clients, s.join_ratio, s.full_last_round and rnd == self.method.training.rounds)
        groups = [[i] for i in ids] if self.method.serial else [ids]
        losses = []
        for g, group in enumerate(groups):
            if g:  # a serial round: the server has moved since the previous client
                self._broadcast(group)
            losses.append(self._local_round(self.at(rnd, group)))
        client_loss = torch.cat(losses)
        n = torch.tensor([self.data.train.counts[i] for i in ids], dtype=torch.float64)
        train_loss = float((client_loss * n).sum() / n.sum())
        if not math.isfinite(train_loss):
            raise DivergedError(
                f"The run diverged in round {rnd}: the training loss became {train_loss}; lower the learning rate (lr) and run again."
            )
        self.round = rnd
        self._broadcast(list(range(self.data.num_clients)))
        row = {"round": rnd, "clients": len(ids), "train_loss": train_loss}
        if rnd % s.eval_gap == 0:
            row.update(self.evaluate())
        self.best_acc = max(self.best_acc, row.get("acc", -math.inf))
        row["best_acc"] = self.best_acc if self.best_acc > -math.inf else math.nan
        row["time_s"] = time.perf_counter() - t0
        self.history.append(row)
        return row

    # --- exact save / restore
    def state_dict(self) -> dict:
        cpu = lambda d: {k: v.detach().cpu() for k, v in d.items()}  # noqa: E731
        return {
            "round": self.round, "server": cpu(self.server), "clients": cpu(self.clients), "history": list(self.history),
            "torch_rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.round = state["round"]
        self.server = {k: v.to(self.device) for k, v in state["server"].items()}
        self.clients = {k: v.to(self.device) for k, v in state["clients"].items()}
        self.history = list(state["history"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"]:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.best_acc = max((h["acc"] for h in self.history if "acc" in h), default=-math.inf)
