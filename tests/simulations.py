"""Small simulations the tests share: on the 8x8 digits (bundled with scikit-learn), six clients.

`sim_for` builds one (and runs some rounds); `exact_config` is the float64 setting of the exactness
tests, whose sequential reference runs `reference_run` makes once per session (vectorized equals
sequential; no method silently equals another)."""

import math
from functools import cache

import torch
from torch import nn

from tuner.federated_run import build_simulation
from tuner.models import Backbone
from tuner.settings.config import RunConfig


def tiny_batchnorm(input_shape, num_classes):
    """A backbone with BatchNorm in its body and its head, small enough to run every method in seconds
    (registered for the whole session in conftest.py)."""
    width = 16
    body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.BatchNorm1d(width), nn.ReLU())
    return Backbone(body, nn.Sequential(nn.BatchNorm1d(width), nn.Linear(width, num_classes)), width)


# What a method needs in the tests' small runs: FedBN batch norm to be more than FedAvg; FedGen fewer generator
# steps than its 1000 a round (each test that reads them says so)
NEEDS = {"fedbn": {"backbone": "tiny_batchnorm"}, "fedgen": {"hparams": {"server_epochs": 20}}}


def digits(method: str, **kw) -> RunConfig:
    """Six clients on digits; kw: any run setting."""
    base = dict(method=method, dataset="digits", partition="pat:2", clients=6, lr=0.05, **NEEDS.get(method, {}))
    return RunConfig(**{**base, **kw})


def sim_for(method: str, steps: int = 0, **kw):
    """A simulation of `method` after `steps` rounds (of a run at least 5 rounds long)."""
    sim = build_simulation(digits(method, **{"rounds": max(steps, 5), **kw}))
    for _ in range(steps):
        sim.step()
    return sim


def run_rounds(cfg: RunConfig, rounds: int):
    sim = build_simulation(cfg)
    return sim, [sim.step() for _ in range(rounds)]


def client(sim, i: int) -> dict:
    """Client i's state, out of the stack."""
    return {k: v[i] for k, v in sim.clients.items()}


def batch(sim, i: int, n: int = 10, split: str = "train"):
    """n decoded samples of client i."""
    x, y = getattr(sim.data, split).client(i)
    return sim.data.decode(x[:n]), y[:n]


def exact_config(method: str, **kw) -> RunConfig:
    """Float64 (rounding near 1e-14 can never pass for a real difference, 1e-2 and more); uneven clients
    (dir:0.3), partial participation drawn each round, a validation split; two rounds, so that what is
    uploaded in the first comes back."""
    exact = dict(partition="dir:0.3", join_ratio="0.5-1", val_frac=0.2, batch_size=40, rounds=2, dtype="float64")
    return digits(method, **{**exact, **kw})


@cache
def reference_run(method: str):
    """Two rounds on the sequential executor; `sim.drew_globally` says whether a round read torch's global generator."""
    sim = build_simulation(exact_config(method, executor="sequential"))
    generator = torch.get_rng_state()
    for _ in range(2):
        sim.step()
    sim.drew_globally = not torch.equal(generator, torch.get_rng_state())
    return sim


EXACT = dict(rtol=1e-9, atol=1e-9)  # float64: what the executors and a resume must agree to


def assert_equal_states(a, b):
    for x, y in ((a.clients, b.clients), (a.server, b.server)):
        for k in x:
            torch.testing.assert_close(y[k], x[k], **EXACT)
