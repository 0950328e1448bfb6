"""pFL methods, one module per method; each reads like its paper's algorithm box.

Ablations and variants are the same method with other hyperparameter defaults, registered
under the papers' names in lower case (`gpfl-nocov`, `fedcp-nocpn-nogh`, `fedpac-fa`, `apfl-outputs`, ...)
in their module's `VARIANTS`. The reference code's forms, where it departs from its paper, are small subclasses
that override only what differs (`gpfl-pfllib`, `fedcp-gumbel`, `fedphp-pfllib`, `pfedme-official`,
`fedpac-official`, `fedpac-pfllib`, `fedlc-pfllib`, `fedcac-pfllib`).

The registry is a scan: every class of this package's modules that names itself (`name = ...`), and every entry
of a module's `VARIANTS`, is a method, listed by its `origin` (the papers' methods, their tables' baselines,
PFLlib's roster), then by module, each followed by its variants and reference forms. Adding a method is adding
its module. Methods of one's own live outside this package and are named by file or entry point (tuner/plugins.py).
"""

import importlib
import pkgutil

from algorithms.base import Method, Unsupported
from algorithms.capabilities import BatchedStatistics, Carried, HeldOut, Memory, Serial, TrainsOnReceipt
from algorithms.common import weighted_mean
from algorithms.net import Net
from algorithms.optimizers import SGD, Adam, Yogi
from algorithms.rounds import Federation, Passes, Phase, Round, Training
from algorithms.variants import variant

ORIGINS = ("paper", "baseline", "roster")  # the listing's order


def scan(package: str) -> dict[str, type[Method]]:
    """Every method of a package's modules, by name, in listing order (this module's docstring)."""
    found: list[type[Method]] = []
    modules = pkgutil.iter_modules(importlib.import_module(package).__path__)
    for module_info in sorted(modules, key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{module_info.name}")
        defined = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Method) and obj.__module__ == module.__name__
        ]
        found += [cls for cls in defined if "name" in cls.__dict__] + list(getattr(module, "VARIANTS", []))
    unplaced = [cls.__name__ for cls in found if cls.origin not in ORIGINS and not cls.family]  # variants inherit it
    if unplaced:
        raise TypeError(f"{', '.join(unplaced)}: set `origin` to one of {', '.join(ORIGINS)}")
    listed = sorted(dict.fromkeys(found), key=lambda cls: ORIGINS.index(cls.origin))  # stable: modules in order
    names = [cls.name for cls in listed]
    taken = sorted({name for name in names if names.count(name) > 1})
    if taken:
        raise TypeError(f"{', '.join(taken)}: two methods take this name; give each its own")
    return {cls.name: cls for cls in listed}


METHODS: dict[str, type[Method]] = scan(__name__)

# The public interface a method of one's own is written against (docs/own_code.md, "Add your method in one file").
__all__ = [
    "METHODS",
    "SGD",
    "Adam",
    "BatchedStatistics",
    "Carried",
    "Federation",
    "HeldOut",
    "Memory",
    "Method",
    "Net",
    "Passes",
    "Phase",
    "Round",
    "Serial",
    "Training",
    "TrainsOnReceipt",
    "Unsupported",
    "Yogi",
    "variant",
    "weighted_mean",
]
