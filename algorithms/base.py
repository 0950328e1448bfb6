"""The method interface: a pFL method is a handful of pure functions of tensor dicts.

A client's state and the server's state are flat dicts of tensors ("body.0.weight",
"head.weight", plus whatever a method adds). The engine, written once, runs every method.
Per-client functions take the client's state first and the server's state second:

    broadcast(client, server, index) -> client   what client `index` takes from the server each round
    begin_local(client, server, stats) -> client before local training (stats: see `statistics`)
    phases()                      -> [Phase]     local training: which tensors, how long, which loss
    loss(state, server, x, y)     -> scalar      the local objective of one minibatch
    end_local(client, server, stats) -> client   after local training
    upload(client, server)        -> dict        what a client sends
    aggregate(server, uploads, weights, ids) -> server   (uploads stacked over the cohort `ids`)
    logits(state, server, x)      -> logits      how a client predicts (its personalized model)

What else a method may declare, each used by a few methods and written once in the engine:
    statistics(state, server, x, y, w) + stats_before / stats_after: sums over the client's
        training data before / after local training, handed to begin_local / end_local
        (FedPAC's feature statistics, FedRoD's label counts, SCAFFOLD's step count, HypCluster's
        and FedFomo's losses of other models, FedEM's E-step, FedProto's prototypes);
    several phases, each training some tensors with its own loss, epochs, lr or step cap
        (FedRep, Ditto, Per-FedAvg's one adaptation step); a loss may itself run inner gradient
        steps with torch.func (Per-FedAvg's MAML step, pFedMe's K steps);
    more than one model per client: a copy of the backbone under a prefix (Net.copy, Net.logits
        with a prefix, Net.stacked for k of them: Ditto, APFL, FedEM, FedPHP);
    per-client state on the server: tensors with a client dimension that `broadcast(..., index)`
        reads and `aggregate(..., ids)` writes (FedPAC's heads, FedAMP's cloud models, FedFomo's
        stored models, which other clients then download); `aggregate` runs once per round, not
        under vmap, so it may train with autograd (pFedHN's hypernetwork);
    eval_phases: fine-tuning of copies before evaluation (FedAvg-FT, FedBABU, FedEM-FT);
    remembers + memory: a datastore of the client's whole training split for evaluation (kNN-Per);
    holdout: a fraction of each client's training split kept out of local training, over which
        its statistics are taken (FedFomo's validation split);
    serial: the round's clients train one after another, the server aggregating after each and
        the next client receiving its result (pFedHN's Algorithm 1); Phase.batch: a phase that
        draws other than the run's batch size (Per-FedAvg's two batches per step).

The engine maps each per-client function over a cohort one client at a time (sequential) or
all at once with torch.func.vmap (vectorized), so a method must not branch on tensor values or
mutate its inputs. This package depends on torch only.
"""

from __future__ import annotations

import copy

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

State = dict[str, torch.Tensor]


class Net:
    """Functional view of a backbone with `body` (feature extractor) and `head` submodules."""

    def __init__(self, backbone: nn.Module):
        self.module = backbone
        self.feature_dim: int = backbone.feature_dim
        self.param_keys = [k for k, _ in backbone.named_parameters()]
        self.buffer_keys = [k for k, _ in backbone.named_buffers()]
        self._local = {
            part: [k for k, _ in getattr(backbone, part).named_parameters()] + [k for k, _ in getattr(backbone, part).named_buffers()]
            for part in ("body", "head")
        }

    def initial_state(self) -> State:
        return {k: v.detach().clone() for k, v in self.module.state_dict(keep_vars=True).items()}

    def _call(self, part: str, state: State, prefix: str, inp: torch.Tensor) -> torch.Tensor:
        tensors = {k: state[prefix + k] for k in self._local[part]}
        return functional_call(getattr(self.module, part), tensors, (inp,))

    def features(self, state: State, x: torch.Tensor, prefix: str = "body.") -> torch.Tensor:
        return self._call("body", state, prefix, x)

    def head(self, state: State, h: torch.Tensor, prefix: str = "head.") -> torch.Tensor:
        return self._call("head", state, prefix, h)

    def is_buffer(self, key: str) -> bool:
        """BatchNorm statistics, of the backbone or of a copy of it under another prefix ("global.body.bn1.running_mean")."""
        return key.endswith(tuple(self.buffer_keys))

    def logits(self, state: State, x: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """The whole backbone; `prefix` names a copy of it held in the same state ("global.")."""
        return self.head(state, self.features(state, x, prefix + "body."), prefix + "head.")

    def copy(self, model: State, prefix: str) -> State:
        """A second model in a client's state: the backbone's tensors under `prefix`."""
        return {prefix + k: model[k].clone() for k in self.param_keys + self.buffer_keys}

    def fresh(self, seed: int) -> State:
        """Another random initialisation of the backbone, the same for a given seed (k-model methods)."""
        module = copy.deepcopy(self.module)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in module.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        return {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}

    def stacked(self, models: list[State], prefix: str) -> State:
        """Several models in one state: each tensor under `prefix`, stacked along a new dim 0."""
        return {prefix + k: torch.stack([m[k] for m in models]) for k in self.param_keys + self.buffer_keys}

    def keys(self, prefixes: tuple[str, ...], params_only: bool = True) -> list[str]:
        pool = self.param_keys if params_only else self.param_keys + self.buffer_keys
        return [k for k in pool if k.startswith(prefixes)]


@dataclass(frozen=True)
class Phase:
    """One stretch of local SGD over the client's training data."""

    trains: tuple[str, ...]  # prefixes of the client tensors this phase updates
    epochs: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    loss: Callable[..., torch.Tensor] | None = None  # (state, server, x, y) -> scalar; None: the method's loss
    steps: int | None = None  # at most this many minibatch steps (None: every batch of every epoch)
    batch: int | None = None  # samples drawn per step (None: the run's batch size)


@dataclass
class Training:
    """The run's settings a method builds on."""

    lr: float
    local_epochs: int
    batch_size: int
    num_classes: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    rounds: int = 1  # the run's communication rounds, for schedules over training (FedPHP)
    participation: float = 1.0  # the mean share of clients that train in a round (ρ)


@dataclass
class NoHparams:
    pass


class Method:
    """Base class with FedAvg's behaviour: one shared model, trained with cross-entropy."""

    name: ClassVar[str]
    title: ClassVar[str]  # how the papers' tables name it
    Hparams: ClassVar[type] = NoHparams
    shared: ClassVar[tuple[str, ...]] = ("body.", "head.")  # prefixes of what the server holds and clients upload
    stats_before: ClassVar[bool] = False  # run `statistics` over the client's training data before local training
    stats_after: ClassVar[bool] = False  # ... and after it
    protocol: ClassVar[str] = "pfllib"  # the training protocol of its paper (batch, epochs, optimizer: tuner/defaults.py)
    remembers: ClassVar[bool] = False  # evaluate with `memory` of each client's whole training split (a datastore)
    holdout: ClassVar[float] = 0.0  # fraction of each client's training split kept for `statistics`, never trained on
    serial: ClassVar[bool] = False  # clients of a round train one after another, the server aggregating after each
    family: ClassVar[str] = ""  # the method a variant belongs to ("": itself)
    fixed: ClassVar[dict] = {}  # the hyperparameters a variant fixes: its ablation, above every default

    def __init__(self, net: Net, training: Training, hp=None):
        self.net = net
        self.training = training
        self.hp = hp if hp is not None else self.Hparams()

    @classmethod
    def validate(cls, hp) -> str | None:
        """A sentence naming what is wrong with a combination of hyperparameters, or None."""
        return None

    def check(self, num_clients: int) -> str | None:
        """A sentence naming why this method cannot run this backbone or federation, or None."""
        return None

    @property
    def uploads(self) -> bool:
        return bool(self.shared) or type(self).upload is not Method.upload

    # --- what clients and the server hold
    def init_client(self, model: State) -> State:
        return {k: v.clone() for k, v in model.items()}

    def init_server(self, model: State, num_clients: int) -> State:
        return {k: v.clone() for k, v in self.init_client(model).items() if self.is_shared(k)}

    def is_shared(self, key: str) -> bool:
        """Shared: under a shared prefix, BatchNorm statistics excepted (they stay with each client)."""
        return key.startswith(self.shared) and not self.net.is_buffer(key)

    # --- one round
    def broadcast(self, client: State, server: State, index: torch.Tensor) -> State:
        return {**client, **{k: v for k, v in server.items() if self.is_shared(k)}}

    def statistics(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> State:
        """Sums over one batch (w: 1 for real samples, 0 for padding); the engine adds up the batches."""
        raise NotImplementedError(f"{type(self).__name__} asks for statistics but defines none")

    def begin_local(self, client: State, server: State, stats: State) -> State:
        return client

    def end_local(self, client: State, server: State, stats: State) -> State:
        return client

    def sgd(self, trains: tuple[str, ...], epochs: int | None = None, lr: float | None = None, loss=None, steps: int | None = None,
            batch: int | None = None) -> Phase:  # fmt: skip
        """A phase with the run's optimizer (momentum, weight decay); epochs and lr default to the run's."""
        t = self.training
        epochs = t.local_epochs if epochs is None else epochs
        return Phase(trains, epochs, t.lr if lr is None else lr, t.momentum, t.weight_decay, loss, steps, batch)

    def phases(self) -> list[Phase]:
        return [self.sgd(("body.", "head."))]

    def loss(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(state, server, x), y)

    def upload(self, client: State, server: State) -> State:
        return {k: v for k, v in client.items() if self.is_shared(k)}

    def aggregate(self, server: State, uploads: State, weights: torch.Tensor, ids: torch.Tensor) -> State:
        """Sample-weighted mean over the cohort; uploads are stacked along dim 0."""
        return {**server, **weighted_mean(uploads, weights)}

    # --- prediction with the client's personalized model
    def logits(self, state: State, server: State, x: torch.Tensor) -> torch.Tensor:
        return self.net.logits(state, x)

    def memory(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> State:
        """Tensors added to a client's state for evaluation: one row per training sample (dim 0), computed
        a batch at a time over the client's whole training split and joined (w: 0 for padding)."""
        raise NotImplementedError(f"{type(self).__name__} remembers but defines no memory")

    def eval_phases(self) -> list[Phase]:
        """Local training run on a copy of each client before it is evaluated (fine-tuning baselines)."""
        return []


def weighted_mean(stacked: State, weights: torch.Tensor) -> State:
    w = weights / weights.sum()
    return {k: torch.tensordot(w.to(v.dtype), v, dims=1) for k, v in stacked.items()}


def substate(state: State, prefix: str) -> State:
    """The tensors under `prefix`, with the prefix removed: what functional_call wants for a submodule."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def prefixed(module: nn.Module, prefix: str) -> State:
    """A module's initial parameters and buffers under `prefix`."""
    return {prefix + k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}


def hparam_names(method_cls: type[Method]) -> list[str]:
    return [f.name for f in fields(method_cls.Hparams)]


def variant(base: type[Method], title: str, **hparams) -> type[Method]:
    """A named ablation or variant of a method: the same method with other hyperparameter defaults."""
    known = {f.name for f in fields(base.Hparams)}
    assert set(hparams) <= known, f"{title}: unknown hyperparameters {set(hparams) - known}"
    spec = [(f.name, f.type, field(default=hparams.get(f.name, f.default))) for f in fields(base.Hparams)]
    hp_cls = make_dataclass(title.replace("-", "") + "Hparams", spec)
    attrs = {"name": title.lower(), "title": title, "Hparams": hp_cls, "family": base.family or base.name, "fixed": {**base.fixed, **hparams}}
    return type(title.replace("-", "_"), (base,), {**attrs, "__module__": base.__module__})
