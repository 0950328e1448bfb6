"""Tuning while training: Ray Tune's population-based training (PBT) and its GP-bandit form (PB2) over a sweep's
trials. Every `perturbation_interval` rounds a trial in the bottom quantile takes the whole federated state of one
in the top quantile (its checkpoint: every client's and the server's tensors, the method's own state, the rows so
far; keyed draws follow the round) and changes the settings the space lets it mutate. A changed value is a new
input of the same compiled programs, so nothing recompiles. What each trial's state went through, round by round,
is written beside its checkpoint (`ROUNDS_FILE`, tuner/sweep/trainable.py) and replays with `tuner run --schedule`."""

from __future__ import annotations

import optuna
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from tuner.space import Space


def tune_domain(dist: optuna.distributions.BaseDistribution):
    """An Optuna distribution of a space file as Ray Tune's sampling domain (the first population's draws)."""
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return tune.choice(list(dist.choices))
    if isinstance(dist, optuna.distributions.IntDistribution):
        return tune.randint(dist.low, dist.high + 1)
    return (tune.loguniform if dist.log else tune.uniform)(dist.low, dist.high)


def population_scheduler(space: Space):
    """PBT or PB2 over the space's `scheduler.mutate` settings, on the `round` each trial reports. PBT multiplies a
    value by 0.8 or 1.2 (or resamples it), kept within the space's range; PB2 picks values inside the range."""
    pop = space.population
    bounds = {name: (space.search[name].low, space.search[name].high) for name in pop.mutate}
    if pop.kind == "pb2":
        from ray.tune.schedulers.pb2 import PB2  # needs GPy and scikit-learn

        return PB2(time_attr="round", perturbation_interval=pop.interval, quantile_fraction=pop.quantile,
                   hyperparam_bounds={name: list(b) for name, b in bounds.items()})  # fmt: skip

    def within_range(config: dict) -> dict:
        return {**config, **{name: min(max(config[name], low), high) for name, (low, high) in bounds.items()}}

    return PopulationBasedTraining(
        time_attr="round", perturbation_interval=pop.interval, quantile_fraction=pop.quantile,
        resample_probability=pop.resample_probability, custom_explore_fn=within_range,
        hyperparam_mutations={name: tune_domain(space.search[name]) for name in pop.mutate},
    )  # fmt: skip


def first_population(space: Space, seed: int):
    """The search over the first population: the paper's defaults first, then draws from the space, seeded."""
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(points_to_evaluate=[space.defaults()], random_state=seed, max_concurrent=0)
