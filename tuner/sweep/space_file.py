"""Search-space files: fixed settings, distributions over any setting, and how a sweep stops.

A space is a YAML file (see `search_spaces/`):

    method: fedcp                  # optional; must match the method named on the command line
    setting: pfllib-fmnist-dir0.1  # optional: a shared experiment setting (tuner/settings/papers.py SETTINGS)
    settings: {rounds: 500}        # fixed, same names as --set; over the shared setting
    search:                        # one distribution per setting or hyperparameter
      lam: {grid: [0, 0.1, 1, 5, 10]}
      lr: {loguniform: [0.001, 0.05]}
    sampler: tpe                   # any of SAMPLERS; `grid` when every distribution is a grid
    samples: 20
    select: test                   # test (the papers) or val (honest tuning)
    report_every: 1                # rounds between reports to Tune
    stop: {grace: 50, patience: 100, max_total_rounds: null}
    scheduler: asha                # asha (stop.grace), or tune while training: pbt or pb2, or a mapping:
    # scheduler: {kind: pbt, perturbation_interval: 10, quantile: 0.25, resample_probability: 0.25, mutate: [lr, lam]}

Every value a distribution can produce is checked against the method before anything starts,
so a sweep never fails on its hundredth trial because of a typo in its space.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tuner.errors import UserError
from tuner.files import read_mapping
from tuner.plugins import canonical, method_class
from tuner.settings.config import absolute_settings, resolve_layers
from tuner.sweep.schedulers import read_scheduler
from tuner.sweep.space import SAMPLERS, Naming, Space, Stopping

if TYPE_CHECKING:
    from tuner.sweep.space import Distribution
from tuner.sweep.stopping import STOPPING_RULES

KINDS = ("uniform", "loguniform", "int", "categorical", "grid")
SELECTS = ("test", "val")
TOP_KEYS = (
    "method",
    "setting",
    "settings",
    "search",
    "sampler",
    "samples",
    "select",
    "report_every",
    "stop",
    "scheduler",
)


def stop_keys() -> tuple[str, ...]:
    """What a space file's `stop:` may hold: ASHA's grace and every registered stopping rule."""
    return ("grace", *STOPPING_RULES)


def load_space(
    path: str | Path, method: str, overrides: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
) -> Space:
    """Read and check a space file; `overrides` replace its top-level or stop keys, `settings` add to its fixed
    settings."""
    method = canonical(method)
    method_class(method)
    p = Path(path)
    where = str(p)
    data = read_mapping(p, "Space file")
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0]}'; a space file may hold {', '.join(TOP_KEYS)}.")
    # a method of one's own named by its file: from the current directory, as on the command line
    file_method = canonical(str(data["method"])) if data.get("method") else None
    # a variant may use its method's space
    if file_method not in (None, method) and not method.startswith(f"{file_method}-"):
        raise UserError(
            f"{where} is a space for {data['method']}, not {method}; name {data['method']} or pick another file."
        )
    typed = {key for key, value in (overrides or {}).items() if value is not None}

    def named(key: str) -> str:  # a value is blamed where it was typed: the command line, or the file
        return (
            f"--{key.replace('_', '-')}" if key in typed else f"{where}: {'stop.' if key in stop_keys() else ''}{key}"
        )

    _override(data, overrides or {})
    search_names = set(_mapping(data.get("search"), where, "search"))
    clash = search_names & set(settings or {})
    if clash:
        raise UserError(
            f"{where} searches {sorted(clash)[0]}, so it cannot also be fixed with --set; drop one of the two."
        )
    fixed, typed_settings = (
        absolute_settings(
            {**_shared_setting(data.get("setting"), where), **_mapping(data.get("settings"), where, "settings")}
        ),
        absolute_settings(settings or {}),
    )
    # a setting the run refuses is refused here, not by a search probe
    resolved = resolve_layers(method, [(f"{where}: settings", fixed), ("--set", typed_settings)])
    settings = {**fixed, **typed_settings}
    search, grids = _search(method, settings, _mapping(data.get("search"), where, "search"), where)
    space = Space(
        method=method,
        settings=settings,
        search=search,
        grids=grids,
        source=where,
        sampler=str(data.get("sampler") or ("grid" if len(grids) == len(search) else "tpe")),
        samples=_positive(data.get("samples", 10), named("samples")),
        select=str(data.get("select") or "val"),  # selecting on test accuracy would tune on the test set
        report_every=_positive(data.get("report_every", 1), named("report_every")),
        stop=_stopping(data.get("stop"), where, named),
    )
    _check(space, resolved.rounds, named, samples_given="samples" in data)
    space.population = read_scheduler(
        data.get("scheduler"), space, resolved, named, sampler_given="sampler" in data or "sampler" in typed
    )
    if space.select == "val" and resolved.val_frac == 0:  # selection needs a validation split
        space.settings = {**space.settings, "val_frac": 0.1}
    space.base_config()
    return space


def _override(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """The options typed over the file's keys: top-level ones, `stop`'s, and the scheduler's kind (the file's other
    scheduler keys stay)."""
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "scheduler" and isinstance(data.get("scheduler"), dict):
            data["scheduler"] = {**data["scheduler"], "kind": value}
        elif key in stop_keys():
            data["stop"] = {**(data.get("stop") or {}), key: value}
        else:
            data[key] = value


def _search(method: str, settings: dict[str, Any], spec: dict[str, Any], where: str) -> tuple[dict, dict]:
    """The `search` entry's distributions, and its grids in file order; every value a distribution may produce is
    checked to be a valid run."""
    if not spec:
        raise UserError(f"{where}: 'search' names no setting to search; add at least one distribution.")
    search, grids = {}, {}
    for name, entry in spec.items():
        dist, grid = _distribution(name, entry, where)
        for value in _probe_values(dist):
            probe = (f"{where}: search.{name} = {value!r}", {name: value})
            resolve_layers(method, [(f"{where}: settings", settings), probe])
        search[name] = dist
        if grid is not None:
            grids[name] = grid
    return search, grids


def _mapping(value: Any, where: str, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: '{key}' must be a mapping of name: value.")
    return dict(value)


def _shared_setting(name: Any, where: str) -> dict[str, Any]:
    from tuner.settings.papers import SETTINGS

    if name is None:
        return {}
    if name not in SETTINGS:
        raise UserError(
            f"{where}: unknown setting {name!r}; name one of {', '.join(SETTINGS)} or write the values under "
            "'settings'."
        )
    return dict(SETTINGS[name])


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a whole number of at least 1, not {value!r}.")
    return value


def _distribution(name: str, spec: Any, where: str) -> tuple[Distribution, list | None]:
    allowed = ", ".join(f"{{{k}: ...}}" for k in KINDS)
    if not isinstance(spec, dict) or len(spec) != 1:
        raise UserError(f"{where}: search.{name} must be one distribution, one of {allowed}.")
    kind, args = next(iter(spec.items()))
    if kind not in KINDS:
        raise UserError(f"{where}: search.{name} uses unknown distribution '{kind}'; use one of {', '.join(KINDS)}.")
    if kind in ("categorical", "grid"):
        if not isinstance(args, list) or not args or len(set(map(repr, args))) != len(args):
            raise UserError(f"{where}: search.{name}: {kind} needs a list of distinct values, not {args!r}.")
        if any(not isinstance(v, (bool, int, float, str)) for v in args):
            raise UserError(f"{where}: search.{name}: {kind} values must be numbers, strings or booleans.")
        return optuna.distributions.CategoricalDistribution(args), (list(args) if kind == "grid" else None)
    if not (
        isinstance(args, list)
        and len(args) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args)
    ):
        text = (
            next((v for v in args if isinstance(v, str) and _number(v) is not None), None)
            if isinstance(args, list)
            else None
        )
        trap = f"; YAML reads {text} as text: write it {_number(text):.1e}" if text else ""  # 1e-4 has no decimal point
        raise UserError(f"{where}: search.{name}: {kind} needs [low, high], two numbers, not {args!r}{trap}.")
    low, high = args
    if low >= high:
        raise UserError(f"{where}: search.{name}: low {low} must be below high {high}.")
    if kind == "int":
        if not all(float(v).is_integer() for v in args):
            raise UserError(f"{where}: search.{name}: int needs whole-number bounds, not {args!r}.")
        return optuna.distributions.IntDistribution(int(low), int(high)), None
    if kind == "loguniform" and low <= 0:
        raise UserError(f"{where}: search.{name}: loguniform needs a positive low bound, not {low}.")
    return optuna.distributions.FloatDistribution(float(low), float(high), log=kind == "loguniform"), None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _probe_values(dist: Distribution) -> list:
    """Values that stand for all a distribution can produce: every choice; both bounds, and for a float range a
    value between them with a fraction (an int setting searched by a float range is refused up front)."""
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, optuna.distributions.FloatDistribution):
        inside = dist.low * (dist.high / dist.low) ** 0.37 if dist.log else dist.low + 0.37 * (dist.high - dist.low)
        return [dist.low, inside, dist.high]
    return [dist.low, dist.high]


def _stopping(value: Any, where: str, named: Naming) -> Stopping:
    spec = _mapping(value, where, "stop")
    for key, v in spec.items():
        if key not in stop_keys():
            raise UserError(f"{where}: stop.{key} is unknown; stop may hold {', '.join(stop_keys())}.")
        if v is not None:
            _positive(v, named(key))
    rules = {key: v for key, v in spec.items() if key != "grace" and v is not None}
    return Stopping(grace=spec.get("grace"), rules=rules)


def _check(space: Space, rounds: int, named: Naming, samples_given: bool) -> None:
    where = space.source
    if space.sampler != "grid" and space.sampler not in SAMPLERS:
        raise UserError(
            f"{named('sampler')}: unknown sampler '{space.sampler}'; use one of grid, {', '.join(SAMPLERS)}."
        )
    if space.sampler == "grid" and len(space.grids) != len(space.search):
        other = next(k for k in space.search if k not in space.grids)
        raise UserError(f"{where}: the grid sampler needs every distribution to be a grid, but search.{other} is not.")
    if space.select not in SELECTS:
        raise UserError(f"{named('select')} must be test or val, not {space.select!r}.")
    if space.stop.grace is not None and space.stop.grace > rounds:
        raise UserError(f"{named('grace')} ({space.stop.grace}) exceeds the run's {rounds} rounds.")
    if space.sampler == "grid":
        points = space.grid_points()
        if samples_given and space.samples != points:  # a grid runs each point once: another count is a slip to say
            space.notes.append(
                f"{named('samples')}: the grid sampler runs each of its {points} points once, so {points} "
                f"trials, not {space.samples}."
            )
        space.samples = points
