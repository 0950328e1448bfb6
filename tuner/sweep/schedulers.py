"""Every scheduler a sweep runs, declared once: what its `scheduler:` entry in a space file may hold and how that is
read, how Ray Tune's scheduler is built from it, and whether its trials take other trials' states (the sweep then
checkpoints every perturbation and the report reads each trial's lineage). `tuner/sweep/space_file.py` reads a
space's entry through `read_scheduler`, `tuner/sweep/stages.py` builds through `SCHEDULERS`, `tuner/report/runs.py`
asks which hand states, and `tuner sweep --help` lists them from here. A new scheduler is a `Scheduler` in
SCHEDULERS, with its read and build functions here or in the module that holds its rule.

ASHA is Optuna's search with trials stopped early over rounds (`stop.grace` in the space file). Population-based
training (PBT, and PB2, its GP-bandit form) tunes while training: every `perturbation_interval` rounds a trial in
the bottom quantile takes the whole federated state of one in the top quantile (its checkpoint: every client's and
the server's tensors, the method's own state, the rows so far; keyed draws follow the round) and changes the
settings the space lets it mutate. A changed value is a new input of the same compiled programs, so nothing
recompiles. What each trial's state went through, round by round, is written beside its checkpoint (`ROUNDS_FILE`,
tuner/sweep/trainable.py) and replays with `tuner run --schedule`. Optuna and Ray are imported only where a space
is read or a scheduler built, so `tuner run` and `tuner report` need neither."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.errors import UserError
from tuner.sweep.space import Population

if TYPE_CHECKING:  # Optuna and Ray are imported where a sweep reads or builds: `tuner run` needs neither
    from ray.tune.schedulers import TrialScheduler
    from ray.tune.search import BasicVariantGenerator
    from ray.tune.search.sample import Domain

    from tuner.settings.config import RunConfig
    from tuner.sweep.space import Distribution, Naming, Space

# What population-based training may change while a trial trains: floats every step reads as a program input (a
# changed value recompiles nothing, docs/engine.md), never what shapes a step or the data (batch size, epochs, the
# backbone, the split). A method's own float hyperparameters join these.
MUTABLE_SETTINGS = ("lr", "momentum", "weight_decay")


@dataclass(frozen=True)
class Scheduler:
    """One scheduler: `read` turns its `scheduler:` entry into the space's `population` (None for a scheduler that
    hands no states), `build` makes Ray Tune's scheduler for a sweep of `rounds`-round trials (None: none needed)."""

    name: str
    help: str  # one phrase for `tuner sweep --help`
    keys: tuple[str, ...]  # what its `scheduler:` mapping may hold besides `kind`
    hands_states: bool  # its trials take other trials' states
    read: Callable[..., Population | None]
    build: Callable[[Space, int], TrialScheduler | None]


def read_asha(kind: str, spec: dict, space: Space, cfg: RunConfig, named: Naming, sampler_given: bool) -> None:
    """ASHA takes nothing beyond its name: its grace period is the space's `stop.grace`."""
    return None


def asha(grace: int | None, rounds: int) -> TrialScheduler | None:
    """ASHA over rounds: a trial reaching a rung below the top quarter of its peers stops there."""
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="round", max_t=rounds, grace_period=grace) if grace else None


def read_population(
    kind: str, spec: dict, space: Space, cfg: RunConfig, named: Naming, sampler_given: bool
) -> Population:
    """A population-based `scheduler:` entry (pbt, pb2), every setting it would perturb checked to be one a trial can
    change between two rounds."""
    where = space.source
    mutate, interval = _mutated(kind, spec, space, cfg), _interval(spec, space, cfg)
    quantile, resample = spec.get("quantile", 0.25), spec.get("resample_probability", 0.25)
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 0.5:
        raise UserError(f"{where}: scheduler.quantile must be above 0 and at most 0.5, not {quantile!r}.")
    if isinstance(resample, bool) or not isinstance(resample, (int, float)) or not 0 <= resample <= 1:
        raise UserError(f"{where}: scheduler.resample_probability must be between 0 and 1, not {resample!r}.")
    if space.samples < 2:
        raise UserError(f"{named('samples')}: {kind} needs a population of at least 2 trials, not {space.samples}.")
    if space.stop.grace is not None:
        space.notes.append(
            f"{named('grace')}: ASHA does not run under {kind}, which replaces the bottom trials' states "
            "instead of stopping them."
        )
        space.stop.grace = None
    if sampler_given:
        space.notes.append(
            f"{named('sampler')}: {kind} draws its first population at random (after the paper's defaults), "
            "not with an Optuna sampler."
        )
    return Population(kind, interval, float(quantile), float(resample), list(mutate))


def _mutated(kind: str, spec: dict, space: Space, cfg: RunConfig) -> list[str]:
    """The settings a population perturbs: float settings a step reads as inputs, searched by a float range."""
    where = space.source
    mutable = set(MUTABLE_SETTINGS) | {k for k, v in cfg.hparams.items() if isinstance(v, float)}
    from optuna.distributions import FloatDistribution

    floats = [n for n, d in space.search.items() if isinstance(d, FloatDistribution)]
    mutate = spec.get("mutate", [n for n in floats if n in mutable])
    if not isinstance(mutate, list) or not mutate:
        raise UserError(
            f"{where}: {kind} perturbs float training settings ({', '.join(MUTABLE_SETTINGS)} or the method's float "
            "hyperparameters) searched by a uniform or loguniform range, and none is: search one, or list "
            "them under scheduler.mutate."
        )
    for name in mutate:
        if name not in space.search:
            raise UserError(
                f"{where}: scheduler.mutate names {name!r}, which search does not; search it too, or drop it "
                "from mutate."
            )
        if name not in mutable:
            raise UserError(
                f"{where}: scheduler.mutate names {name!r}, which shapes a training step or the data, so a "
                "trial cannot change it "
                "between two rounds; drop it from mutate (it stays searched: a trial keeps its value, or "
                "takes its donor's)."
            )
        if name not in floats:
            raise UserError(
                f"{where}: scheduler.mutate names {name!r}, searched by a "
                f"{type(space.search[name]).__name__}; {kind} perturbs "
                "uniform and loguniform ranges only."
            )
    return mutate


def _interval(spec: dict, space: Space, cfg: RunConfig) -> int:
    """Rounds between perturbations: at least one, fewer than the run's, a multiple of the reports'."""
    where = space.source
    interval = spec.get("perturbation_interval", max(1, cfg.rounds // 5))
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise UserError(
            f"{where}: scheduler.perturbation_interval must be a whole number of at least 1, not {interval!r}."
        )
    if interval >= cfg.rounds:
        raise UserError(
            f"{where}: scheduler.perturbation_interval ({interval}) must be below the run's {cfg.rounds} "
            "rounds, or nothing is ever perturbed."
        )
    if interval % space.report_every:
        raise UserError(
            f"{where}: scheduler.perturbation_interval ({interval}) must be a multiple of report_every "
            f"({space.report_every})."
        )
    return interval


def build_population(space: Space, rounds: int) -> TrialScheduler:
    """PBT or PB2 over the space's `scheduler.mutate` settings, on the `round` each trial reports. PBT multiplies a
    value by 0.8 or 1.2 (or resamples it), kept within the space's range; PB2 picks values inside the range."""
    from optuna.distributions import FloatDistribution
    from ray.tune.schedulers import PopulationBasedTraining

    pop = space.population
    assert pop is not None, "built for a space read with a population scheduler"
    ranges = {name: space.search[name] for name in pop.mutate}  # float ranges only (_mutated)
    bounds = {name: (d.low, d.high) for name, d in ranges.items() if isinstance(d, FloatDistribution)}
    if pop.kind == "pb2":
        from ray.tune.schedulers.pb2 import PB2  # needs GPy and scikit-learn

        return PB2(
            time_attr="round",
            perturbation_interval=pop.interval,
            quantile_fraction=pop.quantile,
            hyperparam_bounds={name: list(b) for name, b in bounds.items()},
        )

    def within_range(config: dict) -> dict:
        return {**config, **{name: min(max(config[name], low), high) for name, (low, high) in bounds.items()}}

    return PopulationBasedTraining(
        time_attr="round",
        perturbation_interval=pop.interval,
        quantile_fraction=pop.quantile,
        resample_probability=pop.resample_probability,
        custom_explore_fn=within_range,
        hyperparam_mutations={name: tune_domain(space.search[name]) for name in pop.mutate},
    )


def tune_domain(dist: Distribution) -> Domain:
    """An Optuna distribution of a space file (the kinds tuner/sweep/space_file.py makes) as Ray Tune's sampling
    domain (the first population's draws)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    from ray import tune

    if isinstance(dist, CategoricalDistribution):
        return tune.choice(list(dist.choices))
    if isinstance(dist, IntDistribution):
        return tune.randint(dist.low, dist.high + 1)
    return (tune.loguniform if dist.log else tune.uniform)(dist.low, dist.high)


def first_population(space: Space, seed: int) -> BasicVariantGenerator:
    """The search over the first population: the paper's defaults first, then draws from the space, seeded."""
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(points_to_evaluate=[space.defaults()], random_state=seed, max_concurrent=0)


POPULATION_KEYS = ("perturbation_interval", "quantile", "resample_probability", "mutate")
SCHEDULERS = {
    s.name: s
    for s in (
        Scheduler(
            "asha",
            "Optuna's search, trials stopped early per --grace",
            (),
            False,
            read_asha,
            lambda space, rounds: asha(space.stop.grace, rounds),
        ),
        Scheduler(
            "pbt",
            "population-based training over the space's float settings",
            POPULATION_KEYS,
            True,
            read_population,
            build_population,
        ),
        Scheduler(
            "pb2",
            "PBT whose perturbations a GP bandit chooses",
            POPULATION_KEYS,
            True,
            read_population,
            build_population,
        ),
    )
}


def scheduler_of(space: Space) -> Scheduler:
    """The scheduler a read space runs."""
    return SCHEDULERS[space.population.kind if space.population else "asha"]


def read_scheduler(value: Any, space: Space, cfg: RunConfig, named: Naming, sampler_given: bool) -> Population | None:
    """A space's `scheduler:` entry (a name, or a mapping with `kind`), each key checked against the scheduler that
    takes it."""
    where = space.source
    if isinstance(value, str) or value is None:
        spec = {"kind": value}
    elif isinstance(value, dict):
        spec = dict(value)
    else:
        raise UserError(f"{where}: 'scheduler' must be a mapping of name: value.")
    known = ["kind", *dict.fromkeys(k for s in SCHEDULERS.values() for k in s.keys)]
    unknown = [k for k in spec if k not in known]
    if unknown:
        raise UserError(f"{where}: scheduler.{unknown[0]} is unknown; scheduler may hold {', '.join(known)}.")
    kind = str(spec.get("kind") or "asha")
    if kind not in SCHEDULERS:
        raise UserError(f"{named('scheduler')}: unknown scheduler {kind!r}; use one of {', '.join(SCHEDULERS)}.")
    scheduler = SCHEDULERS[kind]
    for key in spec:
        if key != "kind" and key not in scheduler.keys:
            owners = " and ".join(s.name for s in SCHEDULERS.values() if key in s.keys)
            how = "; ASHA is set by stop.grace" if kind == "asha" else ""
            raise UserError(f"{where}: scheduler.{key} belongs to {owners}{how}.")
    return scheduler.read(kind, spec, space, cfg, named, sampler_given)
