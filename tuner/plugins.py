"""Methods and backbones from outside this repository, found by name like the built-in ones.

A method is named three ways wherever a method name goes (`tuner run`, `tuner sweep`, a space
file's `method:`, a config's `method:`):

    fedavg                   a built-in method or variant (algorithms/__init__.py)
    ./my_method.py:FedNew    a class in a Python file (a relative path is from the current
                             directory, in a space file too); stored as an absolute path
    my_package.methods:FedNew  a class in an importable module
    fednew                   a method an installed package declares in the `pfl_tuner.methods`
                             entry-point group (`tuner methods` lists them)

A backbone is named the same way (`backbone=./my_model.py:build`): a function
(input_shape, num_classes) -> module with `body`, `head` and `feature_dim`.

Everything loaded is checked once, and every way it can be wrong is one sentence. A file is
imported under a module name of its own, once per process (a Ray trial imports it again in its
worker, from the same absolute path: on a cluster, that path must exist on every node).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from dataclasses import MISSING, fields, is_dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from algorithms import METHODS, Method
from tuner.errors import UserError

ENTRY_POINT_GROUP = "pfl_tuner.methods"


def installed_methods() -> dict[str, EntryPoint]:
    """Methods that installed packages declare, by entry-point name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def is_reference(text: str) -> bool:
    """`FILE.py:NAME` or `module:NAME`, as opposed to a plain registered name."""
    return ":" in text


def canonical(text: str) -> str:
    """The form a run records: a file's path made absolute."""
    if not is_reference(text):
        return text
    where, _, attr = text.rpartition(":")
    return f"{Path(where).expanduser().resolve()}:{attr}" if where.endswith(".py") else text


def load_object(text: str, what: str) -> Any:
    """The object `FILE.py:NAME` or `module:NAME` names; one sentence when it cannot be had."""
    where, _, attr = canonical(text).rpartition(":")
    if not where or not attr:
        raise UserError(f"{what} '{text}' must look like path/to/file.py:Name or package.module:Name.")
    module = _import_file(Path(where), what) if where.endswith(".py") else _import_module(where, what)
    if not hasattr(module, attr):
        raise UserError(f"{what} '{text}': {where} defines no '{attr}'.")
    return getattr(module, attr)


_FILES: dict[Path, Any] = {}


def _import_file(path: Path, what: str):
    if path in _FILES:
        return _FILES[path]
    if not path.is_file():
        raise UserError(
            f"{what} file {path} does not exist (on a cluster, every node needs it at this path, or install "
            "it as a package)."
        )
    name = f"pfl_tuner_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a class's module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise UserError(f"{what} file {path} does not import: {_where(e, path)}{type(e).__name__}: {e}") from None
    _FILES[path] = module
    return module


def _import_module(name: str, what: str):
    try:
        return importlib.import_module(name)
    except Exception as e:
        raise UserError(f"{what} module {name} does not import: {type(e).__name__}: {e}") from None


def _where(error: Exception, path: Path) -> str:
    if isinstance(error, SyntaxError) and error.lineno:
        return f"line {error.lineno}: "
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if Path(f.filename) == path]
    return f"line {lines[-1]}: " if lines else ""


def method_class(text: str) -> type[Method]:
    """The method class a name stands for, checked."""
    if text in METHODS:
        return METHODS[text]
    if is_reference(text):
        return checked_method(load_object(text, "Method"), text)
    installed = installed_methods()
    if text in installed:
        try:
            cls = installed[text].load()
        except Exception as e:
            raise UserError(
                f"Method {text} (entry point {installed[text].value}) does not import: {type(e).__name__}: {e}"
            ) from None
        return checked_method(cls, text)
    raise UserError(
        f"Unknown method '{text}'; choose one of {', '.join([*METHODS, *installed])}, or name your own as "
        "path/to/file.py:ClassName."
    )


def checked_method(cls: Any, text: str) -> type[Method]:
    """A user's method class, or one sentence naming what is wrong with it."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise UserError(f"{text} is not a method: subclass algorithms.Method (from algorithms import Method).")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(
            f'Method {text} has no name of its own: set the class attribute name = "..." (how tables and '
            "results call it)."
        )
    if name in METHODS:
        raise UserError(f"Method {text} is named '{name}' like a built-in method; choose another name.")
    if not is_dataclass(cls.Hparams):
        raise UserError(f"Method {text}: Hparams must be a dataclass (@dataclass class Hparams: ...).")
    missing = [f.name for f in fields(cls.Hparams) if f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise UserError(
            f"Method {text}: hyperparameter {missing[0]} has no default; give every Hparams field one (the "
            "run's value when not searched)."
        )
    return cls


def method_title(text: str) -> str:
    """How tables print a method; a user's method whose file is gone keeps its class name."""
    try:
        return method_class(text).title
    except UserError:
        return text.rpartition(":")[2]


def family_settings(cls: type[Method]) -> dict[str, Any]:
    """The hyperparameters a tuned comparison holds for this method, at its own values: a variant's fixed ones
    (FedEM-M5's m, FedPAC-CC's λ = 0), and its family's on/off switches, which a variant turns (FedAS-noPA's align):
    a base searching its ablation's switch would end as that ablation, an ablation searching another's as neither.
    A number a variant fixes stays searched for the base, where it is the base's hyperparameter (FedEM's m)."""
    family = cls.family or cls.name
    members = [m for m in METHODS.values() if (m.family or m.name) == family]
    switches = {k for m in members for k, v in m.fixed.items() if isinstance(v, bool)}
    own = {f.name: f.default for f in fields(cls.Hparams)}
    return {k: own[k] for k in sorted(set(cls.fixed) | switches)}


def is_variant(text: str) -> bool:
    """A built-in ablation or variant (tables show those only where a paper does)."""
    return text in METHODS and bool(METHODS[text].family)
