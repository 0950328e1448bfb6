"""What a pack's method is (tuner/engine/pack.py): its runs' method, each hook of a row reading the row's own state,
its run's server (`RunServer`) and numbers (put on the method while the hook runs, `PackedHooks.pack_reading`), each
phase's optimizer stepping a row with its run's (`RowSGD`), each run aggregating with its own method; and whether runs
are one program at all (`pack_problem`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from algorithms.base import TRAINING_INPUTS, Method, State
from algorithms.capabilities import Memory
from algorithms.optimizers import SGD
from algorithms.rounds import Phase, Round

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
    for name, values in runs_numbers(runs).items():
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


def runs_numbers(runs: list[Method]) -> dict[str, list[Any]]:
    """Each number a run's hooks or phases may read (number_names, phase_numbers), its value in every run."""
    phases = [phase_numbers(m) for m in runs]  # each run's phases built once
    numbers = {name: [number(m, name) for m in runs] for name in number_names(runs[0])}
    return numbers | {name: [p.get(name) for p in phases] for name in phases[0]}


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
