"""The method contract: a pFL method is a few pure functions of tensor dicts.

A client's state and the server's state are flat dicts of tensors ("body.0.weight",
"head.weight", plus whatever a method adds). The engine, written once, runs every method;
a method says what it does in each step of a round; the optional steps it takes are those whose hooks it
defines (read into `passes` when its class is defined):

    init_client(model) / init_server(model)        what each client and the server hold at first
    broadcast(client, server, at)   -> client      what a client takes from the server before it trains
    begin_local(client, server, stats, at) -> client   before local training   (Passes.begin_local)
    phases()                        -> [Phase]     local training: which tensors, how long, which loss
    loss(state, server, x, y)       -> scalar      the local objective of one minibatch
    end_local(client, server, stats, at) -> client     after local training    (Passes.end_local)
    upload(client, server)          -> dict        what a client sends          (Passes.upload)
    aggregate(server, uploads, at)  -> server      uploads stacked over the cohort `at.clients`
    server_optimizer()              -> optimizer   how the default aggregate steps to the cohort's mean
    logits(state, server, x)        -> logits      how a client predicts (its personalized model)

`at` is the `Round`: its number, the run's length, the client's (or the cohort's) id, training samples and
local steps, and the ids of every client the call runs for (`at.group`). `stats` are sums over the client's data
that `statistics` defines (Passes.statistics_before / statistics_after; `trained_statistics` where the pass after
training sums other things); `eval_phases` fine-tunes copies before evaluation. Idioms several methods share (MMD,
label counts, a plain cross-entropy, per-client slots on the server) are in `algorithms/common.py`. What a single
method needs beyond this core (a held-out split, serial rounds, a datastore, training on receipt, ...) is a
capability it names among its bases (algorithms/capabilities.py). A method that cannot run a setting raises
`Unsupported` with one sentence (from its Hparams' __post_init__ for hyperparameters, from __init__ for a backbone
or federation).

Randomness is part of the contract: a method never draws from a global or device generator during
a round. Modules it adds to the backbone (GPFL's valve, FedCP's policy network) are drawn on the
CPU when it is built, right after the backbone and under the run's seed (tuner/federated_run.py
`build_method`), then moved; what it draws later draws on the CPU from `Training.seed` itself
(pFedHN's hypernetwork in `init_server`, `Net.fresh`). Noise during training or prediction (FedCP's
Gumbel policy) is keyed: a method with `draws = True` finds a 0-dim key under `state[DRAW_KEY]` in
loss, logits and statistics, different for every (seed, round, stream, client, step), and turns it
into noise with `algorithms.common.uniform` / `gumbel` (integer hashing: the same numbers on every
device, in both executors). vmap refuses any other draw.

Hyperparameters are read as numbers, in arithmetic only (`self.hp.lam * term`): during a run every
nonzero float of `Hparams` and the run's lr, momentum and weight decay are 0-dim tensors
(`hyperparameter_inputs`), so one compiled program serves every trial of a sweep; zero stays 0.0,
and `is_on(self.hp.lam)` (algorithms/common.py) tells whether a term is switched on
(docs/engine.md, "How a method reads a hyperparameter").

The engine maps each per-client function over a cohort one client at a time (sequential) or all
at once with torch.func.vmap (vectorized), so a method must not branch on tensor values or mutate
its inputs. This module depends on torch only (fedpac.py's server also uses cvxpy).

A method in ten lines: FedProx's local loss, FedAvg's everything else (algorithms/fedprox.py is the real one).

>>> from dataclasses import dataclass
>>> class ProxToy(Method):
...     name = "prox-toy"
...
...     @dataclass
...     class Hparams:
...         mu: float = 0.1
...
...     def loss(self, state, server, x, y):  # eq. 2 of FedProx: CE + mu/2 ||w - w_global||^2
...         prox = sum(((state[k] - server[k]) ** 2).sum() for k in server if self.is_shared(k))
...         return super().loss(state, server, x, y) + self.hp.mu / 2 * prox

It runs on any backbone with a `body` and a `head`; at the server's model the proximal term is zero:

>>> from torch import nn
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> backbone = nn.Module()
>>> backbone.body, backbone.head, backbone.feature_dim = nn.Linear(4, 3), nn.Linear(3, 2), 3
>>> method = ProxToy(Net(backbone), Training(lr=0.1, local_epochs=1, batch_size=2, num_classes=2, clients=1))
>>> server = method.init_server(Net(backbone).initial_state())
>>> x, y = torch.randn(2, 4), torch.tensor([0, 1])
>>> bool(method.loss(server, server, x, y) == Method.loss(method, server, server, x, y))
True
>>> moved = {k: v + 1 for k, v in server.items()}
>>> round(float(method.loss(moved, server, x, y) - Method.loss(method, moved, server, x, y)), 4)  # 0.1/2 * 23
1.15

The passes a round takes are read from the hooks a method defines; sums with nowhere to go are refused when
the class is defined:

>>> class Proximal(Method):
...     def end_local(self, client, server, stats, at):
...         return client
>>> Proximal.passes.end_local, Proximal.passes.statistics_after
(True, False)
>>> class Counting(Method):
...     def statistics(self, state, server, x, y, w):
...         return {}
Traceback (most recent call last):
TypeError: Counting: defines statistics but neither begin_local nor end_local, the hooks that receive them
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from algorithms.common import State, weighted_mean
from algorithms.net import Net
from algorithms.optimizers import SGD, Adam
from algorithms.rounds import Passes, Phase, Round, Training


class Unsupported(ValueError):
    """A method cannot run this combination of hyperparameters, backbone or federation; the message
    is one sentence naming what to change."""


SERVER_OPTIMIZER = "server_opt."  # where the server keeps its optimizer's state


def prefixed_state(state: State) -> State:
    return {SERVER_OPTIMIZER + k: v for k, v in state.items()}


@dataclass
class NoHparams:
    pass


TRAINING_INPUTS = ("lr", "momentum", "weight_decay")  # the run's numbers that a training step reads


def hyperparameter_inputs(method: Method, device: torch.device, dtype: torch.dtype) -> Method:
    """Every float hyperparameter of the method (its Hparams' float fields, and the run's lr, momentum and
    weight decay) becomes a 0-dim tensor of the run's float type on its device, so a compiled program reads
    it as an input, never as a constant: one program serves every trial of a sweep
    (docs/engine.md, "What recompiles"). A zero stays the number 0.0: a term switched off is a program of its own
    (is_on), and a
    method may branch on it. Ints, bools and strings (epochs, k, switches) stay static. The engine calls
    this once for a run; a method reads `self.hp.lam` as before and never calls float() or bool() on it.
    Returns a copy of the method that reads them; the method and its hyperparameters handed in stay as they were."""

    def tensors(values: Any, names: Iterable[str]) -> Any:
        numbers = {name: getattr(values, name) for name in names}
        inputs = {n: torch.tensor(v, dtype=dtype, device=device) for n, v in numbers.items() if type(v) is float and v}
        return replace(values, **inputs)

    out = copy.copy(method)
    out.hp = tensors(method.hp, [f.name for f in fields(method.hp)])
    out.training = tensors(method.training, TRAINING_INPUTS)
    return out


class Method:
    """Base class with FedAvg's behaviour: one shared model, trained with cross-entropy."""

    name: ClassVar[str]
    title: ClassVar[str]  # its printed name, as the papers' tables write it (default: its name)
    paper: ClassVar[str] = ""  # where it was published ("Zhang et al., ICCV 2023"), for `tuner methods`
    # the code or text this form follows ("PFLlib clientgpfl.py"); its docstring says where they differ
    source: ClassVar[str] = ""
    Hparams: ClassVar[type] = NoHparams  # a dataclass; its __post_init__ may raise Unsupported
    shared: ClassVar[tuple[str, ...]] = ("body.", "head.")  # prefixes of what the server holds and clients upload
    passes: ClassVar[Passes] = Passes()  # read from the hooks it defines when its class is defined; never declared
    draws: ClassVar[bool] = False  # loss, logits and statistics find a key for keyed noise under state[DRAW_KEY]
    # where a built-in method comes from: "paper" (GPFL, FedCP, FedPAC), "baseline" (a baseline of their tables) or
    # "roster" (PFLlib's roster beyond them); its variants and reference forms inherit it. One's own: ""
    origin: ClassVar[str] = ""
    family: ClassVar[str] = ""  # set by `variant`: the method a variant belongs to
    fixed: ClassVar[dict] = {}  # set by `variant`: the hyperparameters it fixes
    # why its runs cannot be packed into one program with others (tuner/engine/pack.py), one clause; "": they can
    unpackable: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and "title" not in cls.__dict__:
            cls.title = cls.name
        problem = _declaration_problem(cls)
        if problem:
            raise TypeError(f"{cls.__name__}: {problem}")
        cls.passes = _passes(cls)

    def __init__(self, net: Net, training: Training, hp: Any = None) -> None:
        self.net = net
        self.training = training
        self.hp = hp if hp is not None else self.Hparams()

    # --- what clients and the server hold
    def init_client(self, model: State) -> State:
        return {k: v.clone() for k, v in model.items()}

    def init_server(self, model: State) -> State:
        shared = {k: v.clone() for k, v in self.init_client(model).items() if self.is_shared(k)}
        optimizer = self.server_optimizer()
        return shared if optimizer is None else {**shared, **prefixed_state(optimizer.init(shared))}

    def updated_in_place(self, key: str) -> bool:
        """Tensors a training step's forward writes (batch norm's statistics; capabilities.Carried adds its own): the
        engine hands each step a copy and keeps what it wrote."""
        return self.net.is_buffer(key)

    def is_shared(self, key: str) -> bool:
        """Shared: under a shared prefix, BatchNorm statistics excepted (they stay with each client)."""
        return key.startswith(self.shared) and not self.net.is_buffer(key)

    # --- one round
    def broadcast(self, client: State, server: State, at: Round) -> State:
        """What a client holds once the server has sent it the round's model.

        Args:
            client: the client's state, one client's tensors (the engine maps this over the cohort).
            server: the server's state, every client's the same.
            at: the round the client trains next, its id, samples and steps 0-dimensional.

        Returns:
            the client's whole new state (default: the shared tensors replaced by the server's).
        """
        return {**client, **{k: v for k, v in server.items() if self.is_shared(k)}}

    def statistics(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> State:
        """Sums over one batch (w: 1 for real samples, 0 for padding); the engine adds up the batches."""
        raise NotImplementedError

    def trained_statistics(
        self, state: State, server: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> State:
        """The sums of the pass after training, where they differ from the pass before it
        (FedAS)."""
        raise NotImplementedError

    def begin_local(self, client: State, server: State, stats: State, at: Round) -> State:
        """Before local training (Passes(begin_local=True)).

        Args:
            stats: the sums of `statistics` over the client's data (Passes(statistics_before=True)), else {}.

        Returns:
            the tensors that change, merged into the client's state.
        """
        raise NotImplementedError

    def end_local(self, client: State, server: State, stats: State, at: Round) -> State:
        """After local training (Passes(end_local=True)).

        Args:
            stats: the sums of `statistics` (or `trained_statistics`) with the trained model
                (Passes(statistics_after=True)), else {}.

        Returns:
            the tensors that change, merged into the client's state.
        """
        raise NotImplementedError

    def sgd(
        self,
        trains: tuple[str, ...],
        epochs: int | None = None,
        lr: float | None = None,
        loss: Callable[..., torch.Tensor] | None = None,
        steps: int | None = None,
        batch: int | None = None,
        clip: float | None = None,
        clip_groups: tuple[tuple[str, ...], ...] = (),
        plain: tuple[str, ...] = (),
    ) -> Phase:
        """A phase with the run's optimizer (momentum, weight decay; not for the tensors under `plain`); epochs and
        lr default to the run's."""
        t = self.training
        epochs = t.local_epochs if epochs is None else epochs
        optimizer = SGD(t.lr if lr is None else lr, t.momentum, t.weight_decay, plain=plain)
        return Phase(trains, epochs, optimizer, loss=loss, steps=steps, batch=batch, clip=clip, clip_groups=clip_groups)

    def phases(self) -> list[Phase]:
        """Local training, in order: which tensors each stretch trains, how long, with which loss and optimizer
        (`sgd` makes one with the run's). Default: the whole backbone, the run's epochs, `loss`."""
        return [self.sgd(("body.", "head."))]

    def loss(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective of one minibatch, differentiated with respect to the phase's tensors.

        Args:
            state: the client's state (its trained tensors current).
            server: the server's state as broadcast this round.
            x: the batch's inputs, decoded; y: its labels (a padded row of a `share` phase: IGNORED).

        Returns:
            a scalar (default: cross-entropy of the client's own backbone, not of `logits`).
        """
        return F.cross_entropy(self.net.logits(state, x), y)

    def upload(self, client: State, server: State) -> State:
        """What a client sends after training (default: its shared tensors); the engine stacks the cohort's."""
        return {k: v for k, v in client.items() if self.is_shared(k)}

    def aggregate(self, server: State, uploads: State, at: Round) -> State:
        """The server's new state from the round's uploads.

        Args:
            uploads: each uploaded tensor stacked along dim 0, row i from client `at.clients[i]`.
            at: the round, its tensors the cohort's (`at.samples`: each client's training samples).

        Returns:
            the server's whole state (default: the sample-weighted mean, taken by `server_optimizer`).
        """
        return {**server, **self.server_step(server, weighted_mean(uploads, at.samples))}

    def server_optimizer(self) -> SGD | Adam | None:
        """None: the server takes the cohort's mean. An optimizer: it steps along the pseudo-gradient
        x − mean (SGD with lr 1 is the mean itself; Adam and Yogi make FedAdam and FedYogi)."""
        return None

    def server_step(self, server: State, mean: State) -> State:
        """The server's new tensors (and its optimizer's state) from the cohort's mean."""
        optimizer = self.server_optimizer()
        if optimizer is None:
            return mean
        params = {k: server[k].clone() for k in mean}
        state = {
            k.removeprefix(SERVER_OPTIMIZER): v.clone() for k, v in server.items() if k.startswith(SERVER_OPTIMIZER)
        }
        optimizer.step(params, {k: params[k] - mean[k] for k in mean}, state)
        return {**params, **prefixed_state(state)}

    # --- prediction with the client's personalized model
    def logits(self, state: State, server: State, x: torch.Tensor) -> torch.Tensor:
        """How a client predicts: its personalized model's logits for a batch (default: its own backbone's)."""
        return self.net.logits(state, x)

    def eval_phases(self) -> list[Phase]:
        """Local training run on a copy of each client before it is evaluated (fine-tuning baselines)."""
        return []


def _declaration_problem(cls: type[Method]) -> str | None:
    """What is wrong with a method's hooks, found when its class is defined: sums with nowhere to go, or passes
    declared by hand (they are read from the hooks it defines)."""
    if "passes" in cls.__dict__:
        return "declares its passes, which are read from the hooks it defines: remove `passes = ...`"
    defines = lambda hook: getattr(cls, hook) is not getattr(Method, hook)  # noqa: E731
    if defines("statistics") and not (defines("begin_local") or defines("end_local")):
        return "defines statistics but neither begin_local nor end_local, the hooks that receive them"
    if defines("trained_statistics") and not defines("end_local"):
        return "defines trained_statistics but not end_local, the hook that receives them"
    return None


def _passes(cls: type[Method]) -> Passes:
    """The optional passes a method takes, from the hooks it defines: `statistics` go to each of begin_local and
    end_local it defines (end_local gets `trained_statistics` instead where it defines those), its clients upload
    what it shares or what its `upload` returns."""
    defines = lambda hook: getattr(cls, hook) is not getattr(Method, hook)  # noqa: E731
    statistics, trained = defines("statistics"), defines("trained_statistics")
    return Passes(
        begin_local=defines("begin_local"),
        end_local=defines("end_local"),
        statistics_before=statistics and defines("begin_local"),
        statistics_after=trained or (statistics and defines("end_local")),
        trained_statistics=trained,
        upload=bool(cls.shared) or defines("upload") or defines("aggregate"),
    )
