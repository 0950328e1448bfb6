"""A read search space: what a sweep searches (`Space`), how it stops (`Stopping`) and, for population-based
training, what its population perturbs (`Population`). tuner/sweep/space_file.py reads a space file into one,
checked; the stages build a sweep from it and the schedulers (tuner/sweep/schedulers.py) read and build from it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.selection import FIGURES
from tuner.settings.config import RunConfig, resolve_layers

if TYPE_CHECKING:  # Optuna is imported where a space is read or sampled: the schedulers' names need none of it
    import optuna

    # the distributions a space file makes (tuner/sweep/space_file.py, `_distribution`)
    Distribution = (
        optuna.distributions.CategoricalDistribution
        | optuna.distributions.IntDistribution
        | optuna.distributions.FloatDistribution
    )

# Optuna's samplers a space may name, by their classes in optuna.samplers
SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "cmaes": "CmaEsSampler",
    "gp": "GPSampler",
    "qmc": "QMCSampler",
    "nsga2": "NSGAIISampler",
}
Naming = Callable[[str], str]


def tpe_startup(samples: int) -> int:
    """The trials TPE draws at random before it models the space: a third of the search, from 2 to Optuna's own 10
    (whose default of 10 leaves a search of 10 trials or fewer nothing but random draws)."""
    return min(10, max(2, samples // 3))  # where a key's value was typed: the command line, or the file


@dataclass
class Population:
    """Population-based training over the sweep's trials (Ray Tune's PBT or PB2, asynchronous): every `interval`
    rounds a trial in the bottom `quantile` takes the whole federated state of one in the top quantile (exploit) and
    perturbs or resamples the `mutate` settings (explore; PB2 chooses them by a GP bandit). Not Ray Tune's
    synchronous form: a trial failing between two perturbations leaves the others paused for good (Ray 2.60; seen
    with a diverging GPFL trial)."""

    kind: str  # pbt | pb2
    interval: int  # rounds between perturbations (and checkpoints)
    quantile: float = 0.25
    resample_probability: float = 0.25
    mutate: list[str] = field(default_factory=list)


@dataclass
class Stopping:
    """How a sweep's trials stop early: ASHA's grace and the stopping rules named (tuner/sweep/stopping.py)."""

    grace: int | None = None  # ASHA grace period in rounds (the scheduler's); None: no ASHA
    rules: dict[str, int] = field(default_factory=dict)  # the stopping rules named, by key (STOPPING_RULES)


@dataclass
class Space:
    """A space file read and checked: its method, fixed settings and searched distributions, how its trials are
    sampled, chosen, reported and stopped."""

    method: str
    settings: dict[str, Any]
    search: dict[str, Distribution]
    grids: dict[str, list]  # the `grid` entries, in file order
    sampler: str = "tpe"
    samples: int = 10
    select: str = "val"
    report_every: int = 1
    stop: Stopping = field(default_factory=Stopping)
    population: Population | None = None  # None: Optuna's search, ASHA per stop.grace
    source: str = "space"
    # what the sweep does otherwise than the file or options say, to print
    notes: list[str] = field(default_factory=list)

    def base_config(self) -> RunConfig:
        """The fixed settings resolved, with every searched value at its default."""
        return resolve_layers(self.method, [(self.source, self.settings)])

    def defaults(self) -> dict[str, Any]:
        """The paper's setting of every searched name that its distribution can produce (tried first)."""
        cfg = self.base_config()
        point = {}
        for name, dist in self.search.items():
            value = cfg.hparams[name] if name in cfg.hparams else getattr(cfg, name)
            if _contains(dist, value):
                point[name] = value
        return point

    def first_points(self) -> list[dict[str, Any]] | None:
        """What Optuna's search tries first: the paper's setting, where every searched name has one in range (Ray's
        Optuna search takes whole points only)."""
        point = self.defaults()
        return [point] if self.sampler != "grid" and set(point) == set(self.search) else None

    def grid_points(self) -> int:
        return math.prod(len(v) for v in self.grids.values())

    def make_sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        import optuna

        if self.sampler == "grid":
            return optuna.samplers.GridSampler(self.grids, seed=seed)
        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup(self.samples))
        sampler: optuna.samplers.BaseSampler = getattr(optuna.samplers, SAMPLERS[self.sampler])(seed=seed)
        return sampler

    @property
    def figure(self) -> str:
        """The selecting figure's best so far, as the progress line shows it; runs are ranked by its score
        (tuner.federated_run)."""
        return FIGURES[self.select]


def _contains(dist: Distribution, value: Any) -> bool:
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    return isinstance(value, (int, float)) and not isinstance(value, bool) and dist.low <= value <= dist.high
