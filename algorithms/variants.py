"""A method's named variants and ablations (GPFL's w/o GCE, FedPAC-FA, ...): the same method class with other
hyperparameter defaults, listed by `tuner methods` beside it."""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass

from algorithms.base import Method


def hparam_names(method_cls: type[Method]) -> list[str]:
    return [f.name for f in fields(method_cls.Hparams)]


def variant(base: type[Method], title: str, **hparams) -> type[Method]:
    """A named ablation or variant of a method: the same method with other hyperparameter defaults."""
    known = {f.name for f in fields(base.Hparams)}
    assert set(hparams) <= known, f"{title}: unknown hyperparameters {set(hparams) - known}"
    spec = [
        (f.name, f.type, field(default=hparams.get(f.name, f.default)))
        for f in fields(base.Hparams)
        if f.name in hparams
    ]
    hp_cls = make_dataclass(title.replace("-", "") + "Hparams", spec, bases=(base.Hparams,))  # keeps the base's checks
    attrs = {
        "name": title.lower(),
        "title": title,
        "Hparams": hp_cls,
        "family": base.family or base.name,
        "fixed": {**base.fixed, **hparams},
    }
    return type(title.replace("-", "_"), (base,), {**attrs, "__module__": base.__module__})
