"""`tuner methods --template NAME`: a starting file for a method of one's own, every hook named.

As written, the file is FedAvg (each hook spells out the default it overrides), so it runs at
once and its curve is FedAvg's: change what the method changes, delete the hooks it keeps.
"""

from __future__ import annotations

import re

TEMPLATE = '''"""{title}: <what it does, in one line, and its paper>.

Shared: <what the server holds>. Personal: <what stays with each client>.
Local loss: <the objective, with the paper's equation numbers>.
Upload: <what a client sends>. Server: <how it aggregates>.
Prediction: <which model a client predicts with>.

    tuner run ./{file}:{cls} --dataset digits --partition dir:0.1 --clients 10 --rounds 20
    tuner sweep ./{file}:{cls} --space {name}.yaml
    tuner report results/runs results/sweeps --out results/report

The contract: docs/own_code.md, "Add your method in one file". States are flat dicts of tensors
("body.0.weight", "head.weight", plus what the method adds); hooks are pure functions of them
(no branching on tensor values, no in-place changes to inputs), so both executors run them.
Read a hyperparameter in arithmetic only (self.hp.mu * term; a bool field switches a term): during a
run its float is a tensor, so one compiled program serves every trial
(docs/engine.md, "How a method reads a hyperparameter").
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms import Method, Round, weighted_mean

State = dict[str, torch.Tensor]


class {cls}(Method):
    name = "{name}"  # how runs, spaces and tables call it
    title = "{title}"  # how tables print it
    paper = ""  # where it is published ("Author et al., VENUE YEAR"): `tuner methods` lists it
    source = ""  # the code or text this form follows
    shared = ("body.", "head.")  # prefixes of the tensors the server holds and clients upload
    # the optional hooks below (begin_local, end_local, statistics) run when defined, and only then

    @dataclass
    class Hparams:  # every field needs a default; --set name=value and space files set them
        mu: float = 0.0

    # --- what each client and the server hold at first
    def init_client(self, model: State) -> State:
        return {{k: v.clone() for k, v in model.items()}}

    def init_server(self, model: State) -> State:
        return {{k: v.clone() for k, v in model.items() if self.is_shared(k)}}

    # --- one round
    def broadcast(self, client: State, server: State, at: Round) -> State:
        """What a client takes from the server before it trains (at.number: the round it trains next)."""
        return {{**client, **{{k: v for k, v in server.items() if self.is_shared(k)}}}}

    # Optional, before local training:
    # def begin_local(self, client: State, server: State, stats: State, at: Round) -> State:
    #     return client

    def phases(self):
        """Local training: which tensors (prefixes), how many epochs, at which step size, with which loss."""
        return [self.sgd(("body.", "head."))]

    def loss(self, state: State, server: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective of one minibatch (add the method's terms, weighted by self.hp.mu)."""
        return F.cross_entropy(self.net.logits(state, x), y)

    # Optional, after it:
    # def end_local(self, client: State, server: State, stats: State, at: Round) -> State:
    #     return client

    def upload(self, client: State, server: State) -> State:
        return {{k: v for k, v in client.items() if self.is_shared(k)}}

    def aggregate(self, server: State, uploads: State, at: Round) -> State:
        """uploads: each tensor stacked over the cohort (dim 0); at.samples: each client's n_i."""
        return {{**server, **weighted_mean(uploads, at.samples)}}

    # --- prediction
    def logits(self, state: State, server: State, x: torch.Tensor) -> torch.Tensor:
        return self.net.logits(state, x)
'''


def template(name: str) -> str:
    """The starting file for a method called `name` (its class and title from it)."""
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
        from tuner.errors import UserError

        raise UserError(
            f"Method name '{name}' must be lower case letters, digits, - or _, starting with a letter (e.g. fednew)."
        )
    words = re.split(r"[-_]", name)
    cls = "".join(w[:1].upper() + w[1:] for w in words)
    return TEMPLATE.format(name=name, cls=cls, title=cls, file=f"{name.replace('-', '_')}.py")
