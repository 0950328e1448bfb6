"""The federated engine, written once for every method.

One round: sample a cohort, train it locally (the method's phases of SGD), upload, aggregate,
broadcast the result to every client, and evaluate every client's personalized model.

Two executors run the same pure method functions:
- `sequential`: one client after another, plain torch.func.grad: the reference;
- `vectorized`: the cohort at once, client states stacked along dim 0 and every step mapped
  with torch.func.vmap. Clients with fewer batches drop out of the step: the cohort is
  sorted by step count, so the clients still active are always a prefix of the stack.

All randomness (cohort sampling, batch order) is a function of (seed, round, stream, client),
so a saved state (round, server and client tensors, history) restores a run exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap

from algorithms.base import Method, Phase, State
from tuner.data.augment import augment_draws, crop_flip
from tuner.data.federated import FederatedData, Split
from tuner.errors import DivergedError

EXECUTORS = ("vectorized", "sequential")
FINE_TUNE_STREAM = 1000  # batch-order stream of evaluation-time fine-tuning, apart from training's phases


@dataclass
class EngineSettings:
    seed: int = 0
    batch_size: int = 10
    join_ratio: tuple[float, float] = (1.0, 1.0)  # fixed when equal, else drawn uniformly each round
    eval_gap: int = 1
    executor: str = "vectorized"
    cohort_chunk: int = 0  # clients per vectorized step; 0 = the whole cohort
    eval_batch: int = 256  # samples per client per evaluation step
    augment: bool = False  # random crop + flip of training images (tuner/data/augment.py)
    rounds: int = 0  # the run's length, for full_last_round
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


def _sgd(params: State, grads: State, momentum: State | None, phase: Phase) -> None:
    """torch.optim.SGD's update, in place and fused over all tensors (as its foreach path does)."""
    p = list(params.values())
    d = [grads[k] for k in params]
    if phase.weight_decay:
        d = torch._foreach_add(d, p, alpha=phase.weight_decay)
    if momentum is not None:
        buf = [momentum[k] for k in params]
        torch._foreach_mul_(buf, phase.momentum)
        torch._foreach_add_(buf, d)
        d = buf
    torch._foreach_add_(p, d, alpha=-phase.lr)


def _row(x, i):
    """Client i's slice of a stacked tensor or dict of them."""
    return {k: v[i] for k, v in x.items()} if isinstance(x, dict) else x[i]


def _float_type(states: State) -> torch.dtype:
    """The run's float type (float32, or float64 for exact comparisons), read off its states."""
    return next(v.dtype for v in states.values() if v.is_floating_point())


def _stack(rows: list[State]) -> State:
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]} if rows and rows[0] else {}


class Executor:
    """Runs the method's per-client functions over a cohort whose states are stacked along dim 0."""

    def __init__(self, method: Method, data: FederatedData, settings: EngineSettings):
        self.method = method
        self.data = data
        self.settings = settings

    def _step_loss(self, phase: Phase):
        loss = phase.loss or self.method.loss

        def f(params: State, rest: State, server: State, x, y):
            return loss({**rest, **params}, server, x, y)

        return grad_and_value(f)

    def _schedules(self, ids: list[int], rnd: int, stream: int, phase: Phase) -> list[torch.Tensor]:
        s = self.settings
        batch = phase.batch or s.batch_size
        return [batch_schedule(s.seed, rnd, stream, i, self.data.train.counts[i], batch, phase.epochs)[: phase.steps] for i in ids]

    def _draws(self, ids: list[int], rnd: int, stream: int, schedules: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Each client's augmentation draws, one per scheduled sample; None without augmentation."""
        if not self.settings.augment:
            return None
        return [augment_draws(_mix(self.settings.seed, rnd, stream, i, 0xA6), *sched.shape) for i, sched in zip(ids, schedules)]

    def _inputs(self, idx: torch.Tensor, draws: torch.Tensor | None) -> torch.Tensor:
        """Training inputs of the rows idx: augmented on the stored pixels, then decoded."""
        x = self.data.train.x[idx]
        return self.data.decode(x if draws is None else crop_flip(x, draws))

    def _trainable(self, phase: Phase, state: State) -> list[str]:
        """A phase trains every floating tensor under its prefixes except BatchNorm statistics."""
        net = self.method.net
        return [k for k, v in state.items() if k.startswith(phase.trains) and not net.is_buffer(k) and v.is_floating_point()]


class SequentialExecutor(Executor):
    """The reference: one client at a time, no vmap."""

    def map(self, fn, states: State, server: State, *args) -> State:
        """fn(state_i, server, *args_i) for every client of the stack, restacked."""
        n = next(iter(states.values())).shape[0]
        return _stack([fn(_row(states, i), server, *[_row(a, i) for a in args]) for i in range(n)])

    def train(self, phases, cohort: State, ids, server, rnd, stream_base) -> torch.Tensor:
        """Train the stacked cohort states in place; returns each client's mean minibatch loss."""
        train = self.data.train
        losses = torch.zeros(len(ids), dtype=torch.float64, device=train.y.device)
        steps = torch.zeros(len(ids))
        self.method.net.module.train()
        for p_idx, phase in enumerate(phases):
            grad_fn = self._step_loss(phase)
            keys = self._trainable(phase, cohort)
            scheds = self._schedules(ids, rnd, stream_base + p_idx, phase)
            draws = self._draws(ids, rnd, stream_base + p_idx, scheds)
            for j, (i, sched) in enumerate(zip(ids, scheds)):
                params = {k: cohort[k][j].clone() for k in keys}
                rest = {k: v[j] for k, v in cohort.items() if k not in params}  # views: BatchNorm statistics update in place
                momentum = {k: torch.zeros_like(v) for k, v in params.items()} if phase.momentum else None
                rows = (sched + train.offsets[i]).to(train.y.device)  # one copy per client, not per step
                crops = None if draws is None else draws[j].to(train.y.device)
                for s, idx in enumerate(rows):
                    x = self._inputs(idx, None if crops is None else crops[s])
                    g, loss = grad_fn(params, rest, server, x, train.y[idx])
                    _sgd(params, g, momentum, phase)
                    losses[j] += loss.detach()  # no host sync per step
                    steps[j] += 1
                for k in keys:
                    cohort[k][j] = params[k]
        return losses.cpu() / steps.clamp(min=1)

    @torch.no_grad()
    def sweep(self, fn, states: State, server: State, split: Split, ids: list[int]) -> State:
        """Sum fn(state, server, x, y, w) over each client's samples of a split, in batches."""
        self.method.net.module.eval()
        out = []
        for j, i in enumerate(ids):
            state = _row(states, j)
            x, y = split.client(i)
            w = torch.ones(len(y), device=y.device, dtype=_float_type(states))
            if not len(y):  # a client without samples: one dummy sample of weight 0 gives zero sums of the right shapes
                x, y, w = split.x[:1], split.y[:1], torch.zeros(1, device=y.device, dtype=w.dtype)
            total: State = {}
            for a in range(0, len(y), self.settings.eval_batch):
                b = a + self.settings.eval_batch
                part = fn(state, server, self.data.decode(x[a:b]), y[a:b], w[a:b])
                total = {k: total[k] + v for k, v in part.items()} if total else part
            out.append(total)
        return _stack(out)


class VectorizedExecutor(Executor):
    """The whole cohort at once: stacked states, one vmapped step per batch index."""

    def _chunked(self, n: int, run_chunk) -> None:
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

    def map(self, fn, states: State, server: State, *args) -> State:
        return vmap(fn, in_dims=(0, None, *[0] * len(args)), randomness="different")(states, server, *args)

    def train(self, phases, cohort: State, ids, server, rnd, stream_base) -> torch.Tensor:
        train = self.data.train
        device = train.y.device
        losses = torch.zeros(len(ids), dtype=torch.float64, device=device)
        steps = torch.zeros(len(ids), device=device)
        self.method.net.module.train()
        for p_idx, phase in enumerate(phases):
            step = vmap(self._step_loss(phase), in_dims=(0, 0, None, 0, 0), randomness="different")
            keys = self._trainable(phase, cohort)
            scheds = self._schedules(ids, rnd, stream_base + p_idx, phase)
            draws = self._draws(ids, rnd, stream_base + p_idx, scheds)

            def run_chunk(part: range) -> None:
                # Most steps first: at step s the active clients are a prefix of the stack.
                order = sorted(part, key=lambda j: -len(scheds[j]))
                n_steps = [len(scheds[j]) for j in order]
                if n_steps[0] == 0:
                    return
                index = torch.zeros(len(order), n_steps[0], phase.batch or self.settings.batch_size, dtype=torch.long)
                aug = None if draws is None else torch.zeros(*index.shape, 3, dtype=torch.long)
                for r, j in enumerate(order):
                    index[r, : n_steps[r]] = scheds[j] + train.offsets[ids[j]]
                    if aug is not None:
                        aug[r, : n_steps[r]] = draws[j]
                index = index.to(device)  # the chunk's whole schedule in one copy
                aug = None if aug is None else aug.to(device)
                active = [sum(1 for c in n_steps if c > s) for s in range(n_steps[0])]
                order_t = torch.tensor(order, device=device)
                params = {k: cohort[k][order_t].clone() for k in keys}
                rest = {k: v[order_t].clone() for k, v in cohort.items() if k not in params}
                momentum = {k: torch.zeros_like(v) for k, v in params.items()} if phase.momentum else None
                chunk_loss = torch.zeros(len(order), dtype=torch.float64, device=device)
                for s, a in enumerate(active):
                    idx = index[:a, s]
                    p_a = {k: v[:a] for k, v in params.items()}
                    x = self._inputs(idx, None if aug is None else aug[:a, s])
                    g, loss = step(p_a, {k: v[:a] for k, v in rest.items()}, server, x, train.y[idx])
                    _sgd(p_a, g, None if momentum is None else {k: v[:a] for k, v in momentum.items()}, phase)
                    chunk_loss[:a] += loss.detach()
                for k, v in {**params, **rest}.items():
                    cohort[k][order_t] = v
                losses[order_t] += chunk_loss
                steps[order_t] += torch.tensor(n_steps, dtype=steps.dtype, device=device)

            self._chunked(len(ids), run_chunk)
        return (losses / steps.clamp(min=1)).cpu()

    @torch.no_grad()
    def sweep(self, fn, states: State, server: State, split: Split, ids: list[int]) -> State:
        """Sum fn(state, server, x, y, w) over each client's samples; padded samples carry w = 0."""
        self.method.net.module.eval()
        device = split.y.device
        mapped = vmap(fn, in_dims=(0, None, 0, 0, 0), randomness="different")
        eb = self.settings.eval_batch
        results: dict[int, State] = {}

        def run_chunk(part: range) -> None:
            rows = sorted(part, key=lambda j: -split.counts[ids[j]])  # longest first: active clients are a prefix
            rows_t = torch.tensor(rows, device=device)
            clients_t = torch.tensor([ids[j] for j in rows], device=device)  # once per chunk: no host copy per step
            state = {k: v[rows_t] for k, v in states.items()}
            counts = [split.counts[ids[j]] for j in rows]
            width = min(eb, max(counts[0], 1))  # no wider than the largest client: padding costs a full forward pass
            total: State = {}
            for start in range(0, max(counts[0], 1), width):
                a = max(1, sum(1 for c in counts if c > start))
                index, mask = split.padded_index(clients_t[:a], start, width)
                part_out = mapped({k: v[:a] for k, v in state.items()}, server, self.data.decode(split.x[index]), split.y[index], mask.to(_float_type(states)))
                if not total:
                    total = {k: torch.zeros(len(rows), *v.shape[1:], dtype=v.dtype, device=device) for k, v in part_out.items()}
                for k, v in part_out.items():
                    total[k][:a] += v
            for r, j in enumerate(rows):
                results[j] = {k: v[r] for k, v in total.items()}

        self._chunked(len(ids), run_chunk)
        return _stack([results[j] for j in range(len(ids))])


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
        torch.manual_seed(settings.seed)  # for methods that draw noise (FedCP's Gumbel option); saved with the state
        n = data.num_clients
        dtype = next(v.dtype for v in model.values() if v.is_floating_point())
        as_model = lambda d: {k: v.to(dtype) if v.is_floating_point() else v for k, v in d.items()}  # noqa: E731  method modules are float32
        self.server = as_model(method.init_server(model, n))
        client = as_model(method.init_client(model))
        self.clients = {k: v.unsqueeze(0).repeat(n, *[1] * v.dim()).contiguous() for k, v in client.items()}
        self._broadcast(list(range(n)))
        self.round = 0
        self.history: list[dict] = []
        self.best_acc = -math.inf
        self.weights = torch.tensor(data.train.counts, dtype=torch.float32)

    @property
    def device(self) -> torch.device:
        return next(iter(self.clients.values())).device

    def _broadcast(self, ids: list[int]) -> None:
        ids_t = torch.tensor(ids, device=self.device)
        out = self.executor.map(self.method.broadcast, {k: v[ids_t] for k, v in self.clients.items()}, self.server, ids_t)
        for k, v in out.items():
            self.clients[k][ids_t] = v

    def _local_hook(self, hook, needs_stats: bool, cohort: State, ids: list[int]) -> State:
        """Run begin_local / end_local over the cohort, with a statistics pass first where the method asks."""
        if needs_stats:
            split = self.data.holdout or self.data.train
            stats = self.executor.sweep(self.method.statistics, cohort, self.server, split, ids)
        else:
            stats = {"none": torch.zeros(len(ids), device=self.device)}
        return {**cohort, **self.executor.map(hook, cohort, self.server, stats)}

    def _accuracy(self, state, server, x, y, w):
        out = self.method.logits(state, server, x)
        hits = (out.argmax(-1) == y).to(w.dtype)
        return {"correct": (hits * w).sum(), "loss": (F.cross_entropy(out, y, reduction="none") * w).sum()}

    @torch.no_grad()
    def _memory(self, clients: State, ids: list[int]) -> State:
        """The method's memory of every client's whole training split, padded to the largest client:
        computed eval_batch samples at a time (a whole split at once can outgrow any memory) and
        joined along the sample axis."""
        train = self.data.train
        self.method.net.module.eval()
        parts, longest = [], max(max(train.counts), 1)
        ids_t = torch.tensor(ids, device=self.device)
        for start in range(0, longest, self.settings.eval_batch):
            index, mask = train.padded_index(ids_t, start, self.settings.eval_batch)
            parts.append(self.executor.map(self.method.memory, clients, self.server, self.data.decode(train.x[index]), train.y[index], mask.to(_float_type(clients))))
        return {k: torch.cat([p[k] for p in parts], 1)[:, :longest] for k in parts[0]}

    def evaluate(self) -> dict[str, float]:
        clients = self.clients
        ids = list(range(self.data.num_clients))
        if self.method.eval_phases():  # fine-tune copies of every client first
            clients = {k: v.clone() for k, v in clients.items()}
            self.executor.train(self.method.eval_phases(), clients, ids, self.server, self.round, FINE_TUNE_STREAM)
        if self.method.remembers:
            clients = {**clients, **self._memory(clients, ids)}
        row = {}
        for prefix, split in (("", self.data.test), ("val_", self.data.val)):
            if split is None:
                continue
            sums = self.executor.sweep(self._accuracy, clients, self.server, split, ids)
            m = split_metrics(sums["correct"].cpu(), sums["loss"].cpu().double(), split.counts)
            if prefix:
                row |= {"val_acc": m["acc"], "val_loss": m["loss"]}
            else:
                row |= {k: m[k] for k in ("acc", "acc_client_mean", "acc_std", "acc_cv")} | {"test_loss": m["loss"]}
        return row

    def _local_round(self, ids: list[int], rnd: int) -> torch.Tensor:
        """Train, upload and aggregate one group of clients; returns each client's mean training loss."""
        m = self.method
        ids_t = torch.tensor(ids, device=self.device)
        cohort = {k: v[ids_t].clone() for k, v in self.clients.items()}
        if m.stats_before or type(m).begin_local is not Method.begin_local:
            cohort = self._local_hook(m.begin_local, m.stats_before, cohort, ids)
        client_loss = self.executor.train(m.phases(), cohort, ids, self.server, rnd, 0)
        if m.stats_after or type(m).end_local is not Method.end_local:
            cohort = self._local_hook(m.end_local, m.stats_after, cohort, ids)
        for k, v in cohort.items():
            self.clients[k][ids_t] = v
        uploads = self.executor.map(m.upload, cohort, self.server) if m.uploads else {}
        if uploads:
            self.server = m.aggregate(self.server, uploads, self.weights[ids].to(self.device), ids_t)
        return client_loss

    def step(self) -> dict:
        """Run one round and return its metrics row."""
        t0 = time.perf_counter()
        rnd = self.round + 1
        s = self.settings
        ids = sample_cohort(s.seed, rnd, self.data.num_clients, s.join_ratio, s.full_last_round and rnd == s.rounds)
        groups = [[i] for i in ids] if self.method.serial else [ids]
        losses = []
        for g, group in enumerate(groups):
            if g:  # a serial round: the server has moved since the previous client
                self._broadcast(group)
            losses.append(self._local_round(group, rnd))
        client_loss = torch.cat(losses)
        n = self.weights[ids]
        train_loss = float((client_loss * n.double()).sum() / n.sum())
        if not math.isfinite(train_loss):
            raise DivergedError(
                f"The run diverged in round {rnd}: the training loss became {train_loss}; lower the learning rate (lr) and run again."
            )
        self._broadcast(list(range(self.data.num_clients)))
        self.round = rnd
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
