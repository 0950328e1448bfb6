"""The federated engine, written once for every method.

One round: sample a cohort, train it locally (the method's phases), upload, aggregate,
broadcast the result to every client, and evaluate every client's personalized model. The
per-client work is the executors' (tuner/engine/executors.py): one training loop and one summing loop,
mapped one client at a time or over the whole cohort with vmap.

All randomness (cohort sampling, batch order, augmentation, the keys of a method's noise:
tuner/engine/draws.py) is a function of (seed, round, stream, client), drawn on the CPU, so a saved
state (round, server and client tensors, history) restores a run exactly and a run on a GPU
draws what it draws on a CPU; no global or device generator is read during a round.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.nn.functional as F

from algorithms.base import Method, State, hyperparameter_inputs
from algorithms.capabilities import BatchedStatistics, HeldOut, Memory, Serial, TrainsOnReceipt
from algorithms.rounds import Round
from tuner.data.federated import FederatedData
from tuner.engine.draws import (
    FINE_TUNE_STREAM,
    RECEIVE_STREAM,
    STATISTICS_STREAM,
    TEST_STREAM,
    VAL_STREAM,
    sample_cohort,
)
from tuner.engine.executor_kinds import make_executor
from tuner.engine.executors import EngineSettings, float_type
from tuner.errors import DivergedError


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


class Rounds:
    """What a round does to a federation's clients and server: the round's mechanics, shared by one run
    (`Simulation`) and a pack of runs (tuner/engine/pack.py's `Pack`, whose method and data are its runs')."""

    def __init__(self, method: Method, data: FederatedData, settings: EngineSettings, server: State, clients: State):
        self.method, self.data, self.settings = method, data, settings
        self.executor = make_executor(settings.executor, method, data, settings)
        self.server, self.clients = server, clients
        self.round = 0
        self._broadcast(list(range(data.num_clients)))

    @property
    def device(self) -> torch.device:
        return next(iter(self.clients.values())).device

    def at(self, number: int, ids: list[int]) -> Round:
        """The Round record of clients `ids` in round `number`."""
        counts = [self.data.train.counts[i] for i in ids]
        steps = [sum(p.step_count(c, self.method.training.batch_size) for p in self.method.phases()) for c in counts]
        as_float = lambda v: torch.tensor(v, dtype=float_type(self.clients), device=self.device)  # noqa: E731
        clients = torch.tensor(ids, device=self.device)
        return Round(number, self.method.training.rounds, clients, as_float(counts), as_float(steps), group=clients)

    def _per_client(self, hook: Callable, name: str, states: State, at: Round, *args: Any) -> State:
        """A per-client hook(state, server, *args, at_i) over the stack, each client getting its own Round."""

        def with_round(state: State, server: State, *rest: Any) -> Any:
            *own, clients, samples, steps = rest
            return hook(state, server, *own, replace(at, clients=clients, samples=samples, steps=steps))

        return self.executor.map(
            with_round, states, self.server, *args, at.clients, at.samples, at.steps, hook=name, at=at
        )

    def _broadcast(self, ids: list[int]) -> None:
        """Clients `ids` take what they need from the server for the round they train next."""
        at = self.at(self.round + 1, ids)
        out = self._per_client(
            self.method.broadcast, "broadcast", {k: v[at.clients] for k, v in self.clients.items()}, at
        )
        # every client that received a trained model trains on it at once (FedALA); not the initial one
        if isinstance(self.method, TrainsOnReceipt) and self.round > 0:
            out = {
                **{k: v[at.clients] for k, v in self.clients.items()},
                **{k: v.clone() for k, v in out.items()},
            }  # (broadcast may hand back expanded views)
            self.executor.train(self.method.receive_phases(), out, self.server, at, RECEIVE_STREAM)
        for k, v in out.items():
            self.clients[k][at.clients] = v

    def _local_hook(self, hook: Callable, name: str, with_statistics: bool, cohort: State, at: Round) -> State:
        """begin_local or end_local over the cohort, after a statistics pass where the method declares one."""
        stats = {}
        if with_statistics:
            m, split, after = self.method, self.data.holdout or self.data.train, name == "end_local"
            own = after and m.passes.trained_statistics
            fn, label = (m.trained_statistics, "trained_statistics") if own else (m.statistics, "statistics")
            multiple = m.training.batch_size if isinstance(m, BatchedStatistics) else 1
            stats = self.executor.sum_over(
                fn, cohort, self.server, split, label, at, STATISTICS_STREAM + after, multiple
            )
        return {**cohort, **_own_memory(self._per_client(hook, name, cohort, at, stats), self.server, cohort)}

    def _accuracy(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> Any:
        out = self.method.logits(state, server, x)
        hits = (out.argmax(-1) == y).to(w.dtype)
        return {"correct": (hits * w).sum(), "loss": (F.cross_entropy(out, y, reduction="none") * w).sum()}

    @torch.no_grad()
    def _memory(self, method: Memory, clients: State, at: Round) -> State:
        """The method's memory of every client's whole training split, padded to the largest client:
        computed eval_batch samples at a time (a whole split at once can outgrow any memory) and
        joined along the sample axis."""
        train = self.data.train
        self.method.net.module.eval()
        parts, longest = [], max(max(train.counts), 1)
        for start in range(0, longest, self.settings.eval_batch):
            index, mask = train.padded_index(at.clients, start, self.settings.eval_batch)
            x, y, w = self.data.decode(train.x[index]), train.y[index], mask.to(float_type(clients))
            parts.append(self.executor.map(method.memory, clients, self.server, x, y, w, hook="memory", at=at))
        return {k: torch.cat([p[k] for p in parts], 1)[:, :longest] for k in parts[0]}

    def _evaluation_sums(self) -> list[tuple[str, State, list[int]]]:
        """Each evaluated split's prefix ("" test, "val_"), every client's sums of correct predictions and loss over
        it, and each client's samples in it."""
        clients = self.clients
        at = self.at(self.round, list(range(self.data.num_clients)))
        if self.method.eval_phases():  # fine-tune copies of every client first
            clients = {k: v.clone() for k, v in clients.items()}
            self.executor.train(self.method.eval_phases(), clients, self.server, at, FINE_TUNE_STREAM)
        if isinstance(self.method, Memory):
            clients = {**clients, **self._memory(self.method, clients, at)}
        out = []
        for prefix, split, stream in (("", self.data.test, TEST_STREAM), ("val_", self.data.val, VAL_STREAM)):
            if split is not None:
                sums = self.executor.sum_over(self._accuracy, clients, self.server, split, "logits", at, stream)
                out.append((prefix, sums, split.counts))
        return out

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

    def _train(self, rnd: int, ids: list[int]) -> torch.Tensor:
        """Round `rnd` of the cohort `ids`: each client's mean training loss."""
        groups = [[i] for i in ids] if isinstance(self.method, Serial) else [ids]
        losses = []
        for g, group in enumerate(groups):
            if g:  # a serial round: the server has moved since the previous client
                self._broadcast(group)
            losses.append(self._local_round(self.at(rnd, group)))
        return torch.cat(losses)


class Simulation(Rounds):
    """A whole federated run: its state, one round at a time."""

    def __init__(self, method: Method, data: FederatedData, settings: EngineSettings):
        if isinstance(method, HeldOut):
            data = data.hold_out(method.holdout)
        model = method.net.initial_state()
        dtype = next(v.dtype for v in model.values() if v.is_floating_point())
        method = hyperparameter_inputs(method, next(iter(model.values())).device, dtype)
        server, client = initial_states(method, model)
        clients = {k: v.unsqueeze(0).repeat(data.num_clients, *[1] * v.dim()).contiguous() for k, v in client.items()}
        super().__init__(method, data, settings, server, clients)
        self.history: list[dict] = []
        self.best_acc = -math.inf

    def evaluate(self) -> dict[str, float]:
        return metrics_row(self._evaluation_sums())

    def step(self) -> dict:
        """Run one round and return its metrics row."""
        t0 = time.perf_counter()
        ran = replace(self.executor.ran)  # what ran before this round
        rnd = self.round + 1
        s = self.settings
        ids = sample_cohort(
            s.seed, rnd, self.data.num_clients, s.join_ratio, s.full_last_round and rnd == self.method.training.rounds
        )
        client_loss = self._train(rnd, ids)
        n = torch.tensor([self.data.train.counts[i] for i in ids], dtype=torch.float64)
        train_loss = float((client_loss * n).sum() / n.sum())
        if not math.isfinite(train_loss):
            raise DivergedError(diverged(self.method, rnd, train_loss))
        self.round = rnd
        self._broadcast(list(range(self.data.num_clients)))
        row: dict[str, Any] = {"round": rnd, "clients": len(ids), "train_loss": train_loss}
        if rnd % s.eval_gap == 0:
            row.update(self.evaluate())
        self.best_acc = max(self.best_acc, row.get("acc", -math.inf))
        row["best_acc"] = self.best_acc if self.best_acc > -math.inf else math.nan
        # what ran: compiled, or eager (asked for, or after compiling failed)
        row["engine"] = self.executor.ran.since(ran)
        row["time_s"] = time.perf_counter() - t0
        self.history.append(row)
        return row

    # --- exact save / restore
    def state_dict(self) -> dict:
        cpu = lambda d: {k: v.detach().cpu() for k, v in d.items()}  # noqa: E731
        return {
            "round": self.round,
            "server": cpu(self.server),
            "clients": cpu(self.clients),
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict) -> None:
        self.round = state["round"]
        self.server = {k: v.to(self.device) for k, v in state["server"].items()}
        self.clients = {k: v.to(self.device) for k, v in state["clients"].items()}
        # an older checkpoint's generator states are not needed: nothing draws from them
        self.history = list(state["history"])
        self.best_acc = max((h["acc"] for h in self.history if "acc" in h), default=-math.inf)


def _own_memory(outputs: State, server: State, inputs: State | None = None) -> State:
    """A hook's outputs, each client's in memory of its own: the cohort trains in place, and a hook may hand back a
    server tensor, which vmap returns expanded over the clients (or, for one client, as the server's tensor itself),
    or one of the client's own tensors under another key (FedNTD's copy of its statistics as the round begins),
    which vmap returns as that very tensor: the two keys would then train as one."""
    server_memory = {v.untyped_storage().data_ptr() for v in server.values()}
    held = {v.untyped_storage().data_ptr(): k for k, v in (inputs or {}).items()}

    def aliased(k: str, v: torch.Tensor) -> bool:
        ptr = v.untyped_storage().data_ptr()
        return (v.dim() > 0 and v.stride(0) == 0) or ptr in server_memory or held.get(ptr, k) != k

    return {k: v.clone() if aliased(k, v) else v for k, v in outputs.items()}


def initial_states(method: Method, model: State) -> tuple[State, State]:
    """The server's and one client's state at first, in the run's float type (method modules are float32)."""
    dtype = float_type(model)
    as_model = lambda d: {k: v.to(dtype) if v.is_floating_point() else v for k, v in d.items()}  # noqa: E731
    return as_model(method.init_server(model)), as_model(method.init_client(model))


def metrics_row(sums: list[tuple[str, State, list[int]]]) -> dict[str, float]:
    """A round's evaluation figures from each split's per-client sums (Rounds._evaluation_sums)."""
    row: dict[str, float] = {}
    for prefix, split_sums, counts in sums:
        m = split_metrics(split_sums["correct"].cpu(), split_sums["loss"].cpu().double(), counts)
        if prefix:
            row |= {"val_acc": m["acc"], "val_loss": m["loss"]}
        else:
            row |= {k: m[k] for k in ("acc", "acc_client_mean", "acc_std", "acc_cv")} | {"test_loss": m["loss"]}
    return row


def diverged(method: Method, rnd: int, train_loss: float) -> str:
    """What to change when a run's training loss stops being finite (a DivergedError's message)."""
    # a method's float hyperparameters are 0-dim tensors by now (hyperparameter_inputs)
    own = ", ".join(
        f"{k}={float(v):.4g}"
        for k, v in asdict(method.hp).items()
        if isinstance(v, float) or (isinstance(v, torch.Tensor) and v.numel() == 1)
    )
    return (
        f"The run diverged in round {rnd}: the training loss became {train_loss}; lower the learning "
        f"rate (lr={float(method.training.lr):.4g})"
        + (f" or the step its own settings take ({own})" if own else "")
        + " and run again."
    )
