"""A pack: P runs of one method and setting trained as one federation of P·N clients.

Runs of one method and setting differ only in their seeds, the values of their numbers and their state, so a pack is
the same round over more clients: client i of run r is row r·N + i of every client tensor, trained by the same
executor calls (one vmap, one compiled program, over every run's cohort at once). What stays each run's own:

- its draws: its cohort, batch order, augmentation and noise are keyed by its own seed and its clients' own ids
  (EngineSettings.pack_seeds, Executor.draw_id), so a packed run draws what it draws alone;
- its server: the pack's server holds each run's tensors stacked, `run.KEY` (runs, ...); a row's hooks read its own
  run's (`pack.run` in the row's state picks it), and each run aggregates its own uploads with its own method, a loop
  over runs (so a server written in Python, FedPAC's QP, runs as alone);
- its numbers: every nonzero float of its hyperparameters and its lr, momentum and weight decay, and each phase's
  optimizer numbers, are `number.NAME` (runs,) in the pack's server; a row's hooks read its own, put on the method
  while the hook runs (so `self.hp.lam` reads the row's), and its optimizer steps with its own (`RowSGD`);
- its initial model (drawn from its seed), its figures, history and checkpoint, which are those it has alone.

Runs pack when they are one program: the same method, data, backbone and settings but for the seed and the values of
nonzero numbers (a number 0 in one run and not in another makes two programs). A method that cannot be packed says
why (`Method.unpackable`); its runs run alone."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from algorithms.base import TRAINING_INPUTS, Method, State, hyperparameter_inputs
from algorithms.capabilities import HeldOut, Memory
from algorithms.optimizers import SGD
from algorithms.rounds import Phase, Round
from tuner.data.federated import FederatedData
from tuner.engine.draws import sample_cohort
from tuner.engine.executors import EngineSettings
from tuner.engine.simulation import Rounds, diverged, initial_states, metrics_row
from tuner.errors import UserError

RUN = "pack.run"  # a row's run, in its state
SERVER = "run."  # the pack's server: each run's server tensors, stacked
NUMBER = "number."  # each run's numbers, (runs,)
ROW_HOOKS = ("broadcast", "statistics", "trained_statistics", "begin_local", "end_local", "loss", "upload", "logits")
PHASE_KINDS = ("phases", "eval_phases", "receive_phases")


def pack_problem(runs: list[Method]) -> str | None:
    """Why these runs (each its method as the engine holds it: its numbers 0-dim tensors, hyperparameter_inputs)
    cannot be one program, in a clause; None where they can."""
    first = runs[0]
    if first.unpackable:
        return f"{first.title}'s runs cannot be packed: {first.unpackable}"
    if len({type(m) for m in runs}) > 1:
        return "the runs are of different methods"
    if len({tuple((k, v.shape, v.dtype) for k, v in m.net.initial_state().items()) for m in runs}) > 1:
        return "the runs' backbones differ"
    static = [replace(m.training, seed=0, lr=0.0, momentum=0.0, weight_decay=0.0) for m in runs]
    if any(t != static[0] for t in static):
        return "the runs differ in a setting other than the seed, lr, momentum, weight decay or a hyperparameter"
    numbers = {name: [number(m, name) for m in runs] for name in number_names(first)}
    numbers |= {name: [phase_numbers(m).get(name) for m in runs] for name in phase_numbers(first)}
    for name, values in numbers.items():
        read = {isinstance(v, torch.Tensor) for v in values}
        if len(read) > 1:
            return f"{name.split('.', 1)[-1]} is 0 in some runs and not in others (two programs): pack them apart"
        if read == {False} and len({repr(v) for v in values}) > 1:
            return f"the runs differ in {name}, which no program reads as a number"
    return None


def number_names(method: Method) -> list[str]:
    """Every number a run's hooks may read: its hyperparameters ("hp.NAME"), its training inputs
    ("training.NAME") and the tensors it drew when it was built ("attr.NAME": GPFL's constants of its ablations,
    FedCP's random input), which differ from seed to seed."""
    drawn = [f"attr.{k}" for k, v in vars(method).items() if isinstance(v, torch.Tensor)]
    return [f"hp.{f.name}" for f in fields(method.hp)] + [f"training.{n}" for n in TRAINING_INPUTS] + drawn


def number(method: Method, name: str) -> Any:
    group, field = name.split(".", 1)
    return getattr({"training": method.training, "hp": method.hp}.get(group, method), field)


@dataclass(frozen=True)
class RowSGD(SGD):
    """A packed phase's optimizer: the runs' SGD, each row stepping with its own run's numbers, read from the pack's
    server by the row's run (`rows`: which field, or "group:PREFIX" for a group's lr, reads which number)."""

    rows: tuple[tuple[str, str], ...] = ()

    def for_rows(self, rest: State, server: State) -> SGD:
        own = {field: of_run(server[NUMBER + key], rest[RUN]) for field, key in self.rows}
        groups = tuple((prefix, own.get("group:" + prefix, lr)) for prefix, lr in self.group_lrs)
        return SGD(
            own.get("lr", self.lr),
            own.get("momentum", self.momentum),
            own.get("weight_decay", self.weight_decay),
            groups,
            self.plain,
        )


def of_run(stacked: torch.Tensor, run: torch.Tensor) -> torch.Tensor:
    """Each row's run's slice of a stack over runs (`run`: a row's run, or a stack of rows'), as a gather that vmap
    and a compiled program take as they take any other (an index by a batched tensor would read it on the host)."""
    return torch.index_select(stacked, 0, run.reshape(-1)).reshape(run.shape + stacked.shape[1:])


class RunServer(Mapping):
    """A row's run's server, each tensor gathered from the pack's stack when a hook first reads it: most hooks read a
    few of the server's tensors (FedAvg's loss none), and gathering all of them for every row and step would cost
    more than the step."""

    def __init__(self, server: State, run: torch.Tensor):
        self.stacked = {k.removeprefix(SERVER): v for k, v in server.items() if k.startswith(SERVER)}
        self.run = run
        self.read: dict[str, torch.Tensor] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.read:
            self.read[key] = of_run(self.stacked[key], self.run)
        return self.read[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.stacked)

    def __len__(self) -> int:
        return len(self.stacked)


def optimizer_numbers(optimizer: SGD) -> dict[str, Any]:
    """A phase optimizer's numbers by field ("group:PREFIX" a group's lr)."""
    return {
        "lr": optimizer.lr,
        "momentum": optimizer.momentum,
        "weight_decay": optimizer.weight_decay,
        **{"group:" + prefix: lr for prefix, lr in optimizer.group_lrs},
    }


def phase_numbers(method: Method) -> dict[str, Any]:
    """Every number of a run's phases, "KIND.INDEX.FIELD" (KIND: phases, eval_phases, receive_phases)."""
    return {
        f"{kind}.{k}.{field}": value
        for kind in PHASE_KINDS
        if hasattr(method, kind)
        for k, phase in enumerate(getattr(method, kind)())
        for field, value in optimizer_numbers(phase.optimizer).items()
    }


@dataclass
class PackInfo:
    """What a packed method knows of its pack."""

    runs: list[Method]  # each run's method, its numbers 0-dim tensors (hyperparameter_inputs)
    clients: int  # N, each run's clients
    numbers: list[str]  # the per-row numbers a hook reads ("hp.NAME", "training.NAME")
    packed_class: type
    phases: dict[str, list[Phase]]  # each kind's packed phases, made once


class PackedHooks:
    """What a packed method adds to its method's class: each per-row hook runs on the row's own state, its run's
    server and numbers, and its client's own id; the aggregation runs each run's own; the phases train each row
    with its run's optimizer numbers."""

    pack: PackInfo
    hp: Any  # the method's, as Method holds them
    training: Any

    @contextmanager
    def pack_reading(self, numbers: dict[str, torch.Tensor]) -> Iterator[None]:
        """The method reads these numbers (a row's, or a stack of rows') as its hyperparameters and training's."""
        kept = dict(vars(self))
        hp, training = copy.copy(self.hp), copy.copy(self.training)
        for name, value in numbers.items():
            group, field = name.split(".", 1)
            # no __post_init__ on a batch of numbers: it would branch on them
            object.__setattr__({"training": training, "hp": hp}.get(group, self), field, value)
        self.hp, self.training = hp, training
        try:
            yield
        finally:
            vars(self).update(kept)

    def pack_own(self, fn: Callable, state: State, server: State, *args: Any) -> Any:
        """fn on a row's own state, its run's server and numbers, its client's own id; a hook called from another
        (the row already its own) runs as it is."""
        if RUN not in state:
            return fn(state, server, *args)
        run = state[RUN]
        mine = {k: v for k, v in state.items() if k != RUN}
        its_server = RunServer(server, run)
        numbers = {name: of_run(server[NUMBER + name], run) for name in self.pack.numbers}
        n = self.pack.clients
        args = tuple(own_round(a, n) if isinstance(a, Round) else a for a in args)
        with self.pack_reading(numbers):
            return fn(mine, its_server, *args)

    def pack_phases(self, kind: str, template: Callable[[], list[Phase]]) -> list[Phase]:
        """The runs' phases of a kind, each loss reading a row's own and each optimizer a row's numbers; made once,
        so a compiled step is found again every round."""
        if kind not in self.pack.phases:
            out = []
            for k, phase in enumerate(template()):
                o = phase.optimizer
                rows = tuple(
                    (field, f"{kind}.{k}.{field}")
                    for field, value in optimizer_numbers(o).items()
                    if isinstance(value, torch.Tensor)
                )
                optimizer = RowSGD(o.lr, o.momentum, o.weight_decay, o.group_lrs, o.plain, rows)
                loss = None if phase.loss is None else _own_loss(self, phase.loss)
                out.append(replace(phase, loss=loss, optimizer=optimizer))
            self.pack.phases[kind] = out
        return self.pack.phases[kind]

    def pack_aggregate(self, server: State, uploads: State, at: Round) -> State:
        """Each run's server from its own clients' uploads, by its own method; a run without a client this round
        keeps its own."""
        n, rows = self.pack.clients, at.clients.tolist()
        new: list[State] = []
        for r, method in enumerate(self.pack.runs):
            mine = [j for j, row in enumerate(rows) if row // n == r]
            own = {k.removeprefix(SERVER): v[r] for k, v in server.items() if k.startswith(SERVER)}
            if mine:
                index = torch.tensor(mine, device=at.clients.device)
                ids = at.clients[index] % n
                at_r = replace(at, clients=ids, samples=at.samples[index], steps=at.steps[index], group=ids)
                own = method.aggregate(own, {k: v[index] for k, v in uploads.items()}, at_r)
            new.append(own)
        stacked = {SERVER + k: torch.stack([s[k] for s in new]) for k in new[0]}
        return {**{k: v for k, v in server.items() if k.startswith(NUMBER)}, **stacked}


def own_round(at: Round, clients: int) -> Round:
    """A row's Round as its run has it: its client's own id."""
    return replace(at, clients=at.clients % clients, group=None if at.group is None else at.group % clients)


def _own_loss(pack: PackedHooks, loss: Callable) -> Callable:
    def own_loss(state: State, server: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return pack.pack_own(loss, state, server, x, y)

    return own_loss


def _row_hook(name: str) -> Callable:
    def hook(self: Any, state: State, server: State, *args: Any) -> Any:
        return self.pack_own(getattr(super(self.pack.packed_class, self), name), state, server, *args)

    return hook


def _phase_hook(kind: str) -> Callable:
    def phases(self: Any) -> list[Phase]:
        return self.pack_phases(kind, getattr(super(self.pack.packed_class, self), kind))

    return phases


def packed_method(runs: list[Method], clients: int) -> Method:
    """The method a pack runs: run 0's, each hook of a row reading its own run's state, server and numbers."""
    packed_class = packed_class_of(type(runs[0]))
    out: Any = object.__new__(packed_class)
    out.__dict__.update(runs[0].__dict__)
    numbers = [name for name in number_names(runs[0]) if isinstance(number(runs[0], name), torch.Tensor)]
    out.pack = PackInfo(runs, clients, numbers, packed_class, {})
    return out


PACKED_CLASSES: dict[type, Any] = {}


def packed_class_of(cls: type[Method]) -> Any:
    """A method's class with PackedHooks: one a method for the process, as a compiled program guards on its
    class, so the next pack of the method compiles nothing."""
    if cls not in PACKED_CLASSES:
        PACKED_CLASSES[cls] = _with_packed_hooks(cls)
    return PACKED_CLASSES[cls]


def _with_packed_hooks(cls: type[Method]) -> Any:
    optional = ("statistics", "trained_statistics", "begin_local", "end_local")
    defined = lambda hook: getattr(cls, hook) is not getattr(Method, hook)  # noqa: E731
    hooks = [h for h in ROW_HOOKS if (h not in optional or defined(h)) and (h != "upload" or cls.passes.upload)]
    if issubclass(cls, Memory):
        hooks.append("memory")
    body: dict[str, Any] = {h: _row_hook(h) for h in hooks}
    body |= {kind: _phase_hook(kind) for kind in PHASE_KINDS if hasattr(cls, kind)}
    if cls.passes.upload:
        body["aggregate"] = PackedHooks.pack_aggregate
    packed_class: Any = type(f"Packed{cls.__name__}", (PackedHooks, cls), body)
    assert packed_class.passes == cls.passes, "a pack takes the passes its method takes"
    return packed_class


class Pack(Rounds):
    """P runs of one method and setting as one federation, a round of every run at a time; each run's figures,
    history and checkpoint as it has them alone."""

    def __init__(self, methods: list[Method], data: FederatedData, settings: EngineSettings):
        """Raises ValueError with pack_problem's clause where the runs are not one program."""
        if isinstance(methods[0], HeldOut):
            data = data.hold_out(methods[0].holdout)
        runs, servers, clients = [], [], []
        for method in methods:
            model = method.net.initial_state()
            dtype = next(v.dtype for v in model.values() if v.is_floating_point())
            run = hyperparameter_inputs(method, next(iter(model.values())).device, dtype)
            server, client = initial_states(run, model)
            runs.append(run)
            servers.append(server)
            clients.append(client)
        problem = pack_problem(runs)
        if problem:
            raise ValueError(problem)
        n, p = data.num_clients, len(runs)
        self.runs, self.per_run = runs, n
        numbers = {name: [number(r, name) for r in runs] for name in number_names(runs[0])}
        numbers |= {name: [phase_numbers(r)[name] for r in runs] for name in phase_numbers(runs[0])}
        stacked = {
            NUMBER + name: torch.stack(values)
            for name, values in numbers.items()
            if isinstance(values[0], torch.Tensor)
        }
        server_state = {SERVER + k: torch.stack([s[k] for s in servers]) for k in servers[0]} | stacked
        client_state = {
            k: torch.cat([c[k].unsqueeze(0).expand(n, *c[k].shape) for c in clients]).contiguous() for k in clients[0]
        }
        client_state[RUN] = torch.arange(p, device=self.device_of(client_state)).repeat_interleave(n)
        settings = replace(settings, pack_seeds=tuple(r.training.seed for r in runs))
        super().__init__(packed_method(runs, n), data.tiled(p), settings, server_state, client_state)
        self.histories: list[list[dict]] = [[] for _ in runs]
        self.best_acc = [-math.inf] * p

    @staticmethod
    def device_of(state: State) -> torch.device:
        return next(iter(state.values())).device

    def rows_of(self, run: int) -> slice:
        return slice(run * self.per_run, (run + 1) * self.per_run)

    def step(self) -> list[dict]:
        """Run one round of every run; each run's metrics row, as it has it alone (its time_s the pack's round). A
        run whose training loss stops being finite does not stop the others: its row holds `diverged`, what its
        DivergedError says alone, and its history stays as it was."""
        t0 = time.perf_counter()
        ran = replace(self.executor.ran)
        rnd, s, n = self.round + 1, self.settings, self.per_run
        last = s.full_last_round and rnd == self.method.training.rounds
        cohorts = [sample_cohort(r.training.seed, rnd, n, s.join_ratio, last) for r in self.runs]
        ids = [r * n + i for r, cohort in enumerate(cohorts) for i in cohort]
        client_loss = self._train(rnd, ids)
        rows: list[dict[str, Any]] = []
        start = 0
        for r, cohort in enumerate(cohorts):
            loss = client_loss[start : start + len(cohort)]
            start += len(cohort)
            samples = torch.tensor([self.data.train.counts[i] for i in cohort], dtype=torch.float64)
            train_loss = float((loss * samples).sum() / samples.sum())
            rows.append({"round": rnd, "clients": len(cohort), "train_loss": train_loss})
            if not math.isfinite(train_loss):
                rows[-1]["diverged"] = diverged(self.runs[r], rnd, train_loss)
        self.round = rnd
        self._broadcast(list(range(self.data.num_clients)))
        if rnd % s.eval_gap == 0:
            sums = self._evaluation_sums()
            for r, row in enumerate(rows):
                part = self.rows_of(r)
                row.update(metrics_row([(pre, {k: v[part] for k, v in t.items()}, c[part]) for pre, t, c in sums]))
        engine, seconds = self.executor.ran.since(ran), time.perf_counter() - t0
        for r, row in enumerate(rows):
            self.best_acc[r] = max(self.best_acc[r], row.get("acc", -math.inf))
            row["best_acc"] = self.best_acc[r] if self.best_acc[r] > -math.inf else math.nan
            row |= {"engine": engine, "time_s": seconds, "pack": len(self.runs)}
            if "diverged" not in row:
                self.histories[r].append(row)
        return rows

    def state_dict(self, run: int) -> dict:
        """Run `run`'s state, as its Simulation alone saves it (so either resumes the other's); copies, never views of
        the pack's tensors, which the pack's next round writes into."""
        return {
            "round": self.round,
            "server": {
                k.removeprefix(SERVER): v[run].to("cpu", copy=True)
                for k, v in self.server.items()
                if k.startswith(SERVER)
            },
            "clients": {k: v[self.rows_of(run)].to("cpu", copy=True) for k, v in self.clients.items() if k != RUN},
            "history": list(self.histories[run]),
        }

    def load_state_dict(self, run: int, state: dict) -> None:
        """Run `run` from its saved state (its Simulation's or a pack's); every run of a pack is at one round."""
        if self.round and state["round"] != self.round:
            raise UserError(
                f"Runs packed together go on from one round; one checkpoint is at round {state['round']}, another "
                f"at {self.round}: resume them apart."
            )
        self.round = state["round"]
        for k, v in state["server"].items():
            self.server[SERVER + k][run] = v.to(self.device)
        for k, v in state["clients"].items():
            self.clients[k][self.rows_of(run)] = v.to(self.device)
        self.histories[run] = list(state["history"])
        self.best_acc[run] = max((h["acc"] for h in self.histories[run] if "acc" in h), default=-math.inf)
