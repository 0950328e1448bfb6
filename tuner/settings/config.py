"""A run's settings: one dataclass for the engine and data, plus the method's own hyperparameters.

Settings come from defaults, then a YAML file (`--config`), then `--set name=value`; a name
that is neither a run setting nor a hyperparameter of the method is refused.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, get_type_hints

import torch
import yaml

from algorithms.base import Unsupported
from algorithms.variants import hparam_names
from tuner.data.dataset import NORMALIZATIONS, takes_normalization
from tuner.data.datasets import AS_LOADED, LOADERS
from tuner.data.federated import SHIFTS
from tuner.data.partition import PartitionSetting, natural_clients, parse_partition
from tuner.data.user_data import is_user_data, load_user_data
from tuner.engine.compile import engine_for
from tuner.engine.executors import ENGINES, EXECUTORS
from tuner.errors import UserError
from tuner.files import user_path
from tuner.models import BACKBONES, CONV_FORMS, backbone_for
from tuner.plugins import canonical, is_reference, method_class
from tuner.settings.coercion import coerce
from tuner.settings.defaults import PROTOCOLS, RUN_SETTINGS, paper_defaults
from tuner.settings.papers import home_protocol

DTYPES = ("float32", "float64")
DEFAULT_CLIENTS = 20  # the papers' federation


def resolve_device(name: str) -> str:
    """The run's device: auto is the GPU where there is one."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"Device {name} was asked for but this machine has no CUDA GPU; use device=cpu.")
    try:
        return str(torch.device(name))
    except RuntimeError:
        raise UserError(f"Device '{name}' is not a torch device; use auto, cpu or cuda[:N].") from None


def auto_executor(device: str, batch_size: int) -> str:
    """The faster executor for a device and batch. On a GPU the vectorized one: a client's batch of 10
    leaves it idle. On a CPU the vectorized step's cohort-wide working set stops paying once batches
    are large; measured on the 2-core development machine (docs/performance.md, "Speed"): batch 10, FedAvg
    cnn4 round 18.7 s vectorized against 20.1 s sequential; FedPAC's batch of 50, 2.7 s against 1.6 s.
    Only those two sizes were measured; 32 splits them."""
    return "vectorized" if device.startswith("cuda") or batch_size < 32 else "sequential"


@dataclass(frozen=True)
class RunConfig:
    method: str = "fedavg"
    dataset: str = "fmnist"
    partition: str = "dir:0.1"  # iid, pat:N, dir:BETA, pac:S
    clients: int | None = None  # None: 20, or as many as the data's own clients (partition natural)
    rounds: int = 100
    seed: int = 0  # initialisation, batch order, client sampling
    partition_seed: int = 0  # the data split (fixed across seeds, as the papers keep one split per setting)
    protocol: str | None = None  # pfllib | fedpac; None: the method's own paper's (tuner/settings/papers.py)
    # None below: the papers' value for this protocol, method, dataset and backbone (tuner/settings/defaults.py)
    backbone: str | None = None
    lr: float | None = None
    batch_size: int | None = None
    local_epochs: int | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    augment: bool | None = None  # random crop (pad 4) + horizontal flip of training images
    normalize: str | None = None  # half: (x - 0.5) / 0.5 as PFLlib; dataset: per-channel mean / std; none: as loaded
    full_last_round: bool | None = None  # every client takes part in the last round (FedPAC §5)
    groups: int | None = None  # client i is in group i mod groups (pac partition, shifts)
    join_ratio: str = "1"  # a fraction, or LO-HI to draw it each round
    eval_gap: int = 1
    train_frac: float = 0.75
    val_frac: float = 0.0  # validation carved from each client's training part
    val_seed: int | None = None  # None: the partition's own carve; a number: another draw of the same size
    min_samples: int | None = None  # None: min(10/(1-train_frac), samples/clients/2), PFLlib's generator's floor;
    # natural: None keeps every client, a number leaves out those with fewer training samples
    balance: bool = False  # pathological partition with equal class shares
    shift: str = "none"  # none | concept (label permutation per group) | rotate (feature skew per group)
    pac_train: int | None = None  # FedPAC's per-client sizes; None: the dataset's default
    pac_test: int | None = None
    data_dir: str | None = None
    download: bool = True
    executor: str = "auto"  # auto: auto_executor's rule for the run's device and batch
    engine: str = "auto"  # how a training step runs: eager or compiled; auto: auto_engine's rule for the device
    device: str = "auto"
    deterministic: bool = False  # torch.use_deterministic_algorithms, so a CUDA run resumes bit for bit
    # float64: exact comparisons (executor equality, resume) where rounding must not pass for a mismatch
    dtype: str = "float32"
    cohort_chunk: int = 0
    steps_per_call: int = 1  # training steps a compiled program runs at a call (docs/engine.md)
    conv_form: str = "grouped"  # how convolutions are computed (tuner/models.py, CONV_FORMS): the same numbers
    eval_batch: int = 256
    checkpoint_every: int = 50
    hparams: dict[str, Any] = field(default_factory=dict)

    def resolved(self, worker_rounds: int | None = None) -> RunPlan:
        """The run this configuration describes, planned once: every unset setting filled from the papers' table
        (tuner/settings/defaults.py), the device, executor and engine decided, every value checked, the partition
        parsed and the join ratio read as numbers. `worker_rounds`: in a sweep, the rounds all the trials of its
        worker run (they share its compiled programs), which engine auto weighs in place of the run's own. A plan
        is its own resolution."""
        if isinstance(self, RunPlan) and worker_rounds is None:
            return self
        method = method_class(self.method)
        split = parse_partition(self.partition)
        dataset, clients, backbone = self._data_settings(split.kind)
        protocol = self.protocol or home_protocol(method.family or method.name)
        if protocol not in PROTOCOLS:
            raise UserError(f"Unknown protocol '{protocol}'; choose one of {', '.join(PROTOCOLS)}.")
        if self.backbone is not None and self.backbone not in BACKBONES and not is_reference(self.backbone):
            raise UserError(
                f"Unknown backbone '{self.backbone}'; choose one of {', '.join(BACKBONES)}, or name your own "
                "as path/to/file.py:function."
            )
        join = self.join_range()
        table = paper_defaults(protocol, method.family or method.name, dataset, backbone)
        run = {k: table[k] if getattr(self, k) is None else getattr(self, k) for k in RUN_SETTINGS}
        paper_hp = {k: v for k, v in table.items() if k not in RUN_SETTINGS and k in hparam_names(method)}
        hp = {**asdict(method.Hparams()), **paper_hp, **method.fixed, **self.hparams}
        device = resolve_device(self.device)
        executor = auto_executor(device, run["batch_size"]) if self.executor == "auto" else self.executor
        run["backbone"] = canonical(run["backbone"])
        rounds = self.rounds if worker_rounds is None else worker_rounds
        engine = engine_for(
            self.engine, device, rounds, run["backbone"], canonical(self.method), method.family or method.name
        )
        run["normalize"] = self._normalization(dataset, run["normalize"])
        filled = replace(
            self.settings(),
            method=canonical(self.method),
            dataset=dataset,
            clients=clients,
            protocol=protocol,
            **run,
            device=device,
            executor=executor,
            engine=engine,
            hparams=hp,
            data_dir=str(user_path(self.data_dir)) if self.data_dir else None,  # trials read it from elsewhere
        )
        token = _PLANNING.set(True)
        try:
            plan = RunPlan(**{f.name: getattr(filled, f.name) for f in fields(RunConfig)}, split=split, join=join)
        finally:
            _PLANNING.reset(token)
        _check(plan)  # every run setting filled from the table above
        return plan

    def settings(self) -> RunConfig:
        """The settings alone, as config.yaml holds them: a RunConfig to change and plan again."""
        return RunConfig(**{f.name: getattr(self, f.name) for f in fields(RunConfig)})

    def _data_settings(self, kind: str) -> tuple[str, int, str | None]:
        """The dataset (a user's: its absolute path), the federation's size and the backbone where the data
        decides them; `kind`: the partition's."""
        natural = kind == "natural"
        if not is_user_data(self.dataset):
            if self.dataset not in LOADERS:
                raise UserError(
                    f"Unknown dataset '{self.dataset}'; choose one of {', '.join(LOADERS)}, or give a path to "
                    "your own (.parquet, .npz, PFLlib folder)."
                )
            if natural:
                raise UserError(
                    f"Partition natural keeps the clients a user's data names; {self.dataset} names none: "
                    "choose iid, pat:N, dir:BETA or pac:S."
                )
            return self.dataset, DEFAULT_CLIENTS if self.clients is None else self.clients, self.backbone
        dataset = str(user_path(self.dataset))
        ds = load_user_data(dataset)
        backbone = self.backbone or backbone_for(ds.input_shape)
        if not natural:
            return dataset, DEFAULT_CLIENTS if self.clients is None else self.clients, backbone
        if ds.owners is None:
            raise UserError(
                f"Partition natural keeps the data's own clients, and {dataset} has no client column; add one "
                "or choose iid, pat:N or dir:BETA."
            )
        kept = natural_clients(ds.owners, ds.is_train, self.train_frac, self.min_samples or 0)
        total = int(ds.owners.max()) + 1
        if not kept:
            raise UserError(
                f"Every client of {dataset} has fewer than min_samples={self.min_samples} training samples; "
                "lower min_samples."
            )
        if self.clients not in (None, len(kept)):
            left_out = (
                f" ({total - len(kept)} of its {total} have fewer than min_samples={self.min_samples} training samples)"
                if len(kept) < total
                else ""
            )
            raise UserError(
                f"{dataset} holds {len(kept)} clients{left_out}, so partition natural runs {len(kept)}, not "
                f"clients={self.clients}; "
                "leave clients unset."
            )
        return dataset, len(kept), backbone

    def _normalization(self, dataset: str, chosen: str) -> str:
        """The normalization applied, recorded as such: `none` where the inputs are used as loaded."""
        if self.normalize is not None and self.normalize not in NORMALIZATIONS:
            raise UserError(f"Unknown normalize '{self.normalize}'; choose one of {', '.join(NORMALIZATIONS)}.")
        takes = takes_normalization(load_user_data(dataset)) if is_user_data(dataset) else dataset not in AS_LOADED
        if takes and self.normalize == "none":
            raise UserError(
                f"{dataset} holds images stored as bytes, which the backbones take normalized: set normalize "
                "to half or dataset, or leave it unset."
            )
        if not takes and self.normalize not in (None, "none"):
            raise UserError(
                f"normalize {self.normalize} applies to images stored as bytes, and {dataset}'s inputs are "
                "used as loaded: leave normalize unset."
            )
        return chosen if takes else "none"

    def join_range(self) -> tuple[float, float]:
        text = str(self.join_ratio)
        try:
            lo, _, hi = text.partition("-")
            lo_f, hi_f = float(lo), float(hi or lo)
        except ValueError:
            lo_f = hi_f = -1.0
        if not 0 < lo_f <= hi_f <= 1:
            raise UserError(f"join_ratio '{text}' must be a fraction in (0, 1] or a range like 0.5-1.")
        return lo_f, hi_f

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self.settings()), sort_keys=False)


_PLANNING: ContextVar[bool] = ContextVar("planning", default=False)


@dataclass(frozen=True)
class RunPlan(RunConfig):
    """A run planned once (`RunConfig.resolved`): every setting the papers' table fills set, the device, executor
    and engine decided, each value checked, the partition parsed (`split`) and the join ratio as numbers (`join`).
    What runs a simulation takes a plan. A plan is not changed by `replace`: change its `settings()` and plan
    them again."""

    clients: int = 0
    protocol: str = ""
    backbone: str = ""
    lr: float = 0.0
    batch_size: int = 0
    local_epochs: int = 0
    momentum: float = 0.0
    weight_decay: float = 0.0
    groups: int = 0
    full_last_round: bool = False
    augment: bool = False
    normalize: str = ""
    split: PartitionSetting = PartitionSetting("iid", None)
    join: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        if not _PLANNING.get():
            raise TypeError("A RunPlan is made by RunConfig.resolved(); change its settings() and resolve them.")


def _check(cfg: RunPlan) -> None:
    """Every planned setting checked."""
    for name in (
        "clients",
        "rounds",
        "batch_size",
        "eval_gap",
        "groups",
        "checkpoint_every",
        "eval_batch",
        "steps_per_call",
    ):
        if getattr(cfg, name) < 1:
            raise UserError(f"Setting {name} must be at least 1, not {getattr(cfg, name)}.")
    for name in ("local_epochs", "cohort_chunk", "seed", "partition_seed", "momentum", "weight_decay"):
        if getattr(cfg, name) < 0:
            raise UserError(f"Setting {name} cannot be negative, not {getattr(cfg, name)}.")
    if not 0 < cfg.train_frac < 1 or not 0 <= cfg.val_frac < 1:
        raise UserError(
            f"train_frac must lie in (0, 1) and val_frac in [0, 1), not {cfg.train_frac} and {cfg.val_frac}."
        )
    if cfg.val_seed is not None and (cfg.val_seed < 0 or cfg.val_frac == 0):
        raise UserError(
            f"Setting val_seed ({cfg.val_seed}) draws the validation split: it must be 0 or more, with val_frac "
            "above 0."
        )
    choices = {
        "shift": SHIFTS,
        "dtype": DTYPES,
        "executor": ("auto", *EXECUTORS),
        "engine": ("auto", *ENGINES),
        "conv_form": CONV_FORMS,
    }
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise UserError(f"Unknown {name} '{getattr(cfg, name)}'; choose one of {', '.join(allowed)}.")
    if cfg.lr <= 0:
        raise UserError(f"Setting lr must be positive, not {cfg.lr}.")
    try:
        method_class(cfg.method).Hparams(**cfg.hparams)
    except Unsupported as e:
        raise UserError(str(e)) from None


RUN_FIELDS = {name: hint for name, hint in get_type_hints(RunConfig).items() if name != "hparams"}


def apply_settings(cfg: RunConfig, settings: dict[str, Any], source: str) -> RunConfig:
    """Apply name -> value pairs to run settings or the method's hyperparameters."""
    method = method_class(cfg.method)
    hp_cls = method.Hparams
    hp_fields = {f.name: f for f in fields(hp_cls)}
    hp_hints = get_type_hints(hp_cls)
    updates: dict[str, Any] = {}
    hp = dict(cfg.hparams)
    for name, value in settings.items():
        if name in RUN_FIELDS or name in hp_fields:
            try:
                typed = coerce(name, value, RUN_FIELDS[name] if name in RUN_FIELDS else hp_hints[name])
            except UserError as e:
                raise UserError(f"{source}: {e}") from None
            (updates if name in RUN_FIELDS else hp)[name] = typed
        else:
            allowed = ", ".join(list(RUN_FIELDS) + hparam_names(method))
            raise UserError(f"{source}: '{name}' is not a setting of {cfg.method}; allowed: {allowed}.")
    return replace(cfg.settings(), **updates, hparams=hp)


def absolute_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings that name files (a user's dataset or backbone, data_dir) with their paths made absolute
    where the user typed them: a Ray trial reads its settings in a working directory of its own."""
    out = dict(settings)
    if isinstance(out.get("dataset"), str) and is_user_data(out["dataset"]):
        out["dataset"] = str(user_path(out["dataset"]))
    if isinstance(out.get("backbone"), str):
        out["backbone"] = canonical(out["backbone"])
    if out.get("data_dir"):
        out["data_dir"] = str(user_path(out["data_dir"]))
    return out


def parse_set(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise UserError(f"--set '{pair}' must look like name=value.")
        if not value.strip():  # an empty value is a slip, not a request for the default
            raise UserError(
                f"--set '{pair}' gives {name.strip()} no value; write {name.strip()}=VALUE, or leave it out "
                "for the default."
            )
        out[name.strip()] = yaml.safe_load(value)
    return out


def resolve_layers(method: str, layers: list[tuple[str, dict[str, Any]]], worker_rounds: int | None = None) -> RunPlan:
    """The run that layers of settings describe, each over the ones before (a file, the options, --set, a
    trial's values), resolved: where settings become a run, the one place that resolves them. A value the run
    refuses is blamed on the layer that brought it (0 is a value, never unset)."""
    cfg, applied = RunConfig(method=method), []
    for source, settings in layers:
        if settings:
            cfg = apply_settings(cfg, settings, source)
            applied.append((source, cfg))
    resolved = _resolution(cfg, worker_rounds)
    if isinstance(resolved, RunConfig):
        return resolved
    # the first layer it follows
    blamed = next((source for source, partial in applied if str(_resolution(partial)) == str(resolved)), None)
    raise UserError(f"{blamed}: {resolved}" if blamed else str(resolved)) from None


def _resolution(cfg: RunConfig, worker_rounds: int | None = None) -> RunPlan | UserError:
    try:
        return cfg.resolved(worker_rounds)
    except UserError as refused:
        return refused
