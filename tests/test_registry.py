"""The methods' registry is a scan of the package: a method is registered by its module alone, listed by origin,
then module, each followed by its variants; a method without an origin, or two with one name, are refused."""

import pytest

import algorithms
from algorithms import METHODS, scan

TOY = """
from algorithms import Method, variant
from dataclasses import dataclass


class {cls}(Method):
    name = "{name}"
    {origin}

    @dataclass
    class Hparams:
        mu: float = 0.1


VARIANTS = [variant({cls}, "{cls}-big", mu=1.0)]
"""


def toy_package(root, package, methods):
    folder = root / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "helpers.py").write_text("SCALE = 2\n")  # a module without methods is passed over
    for module, (cls, origin) in methods.items():
        line = f'origin = "{origin}"' if origin else ""
        (folder / f"{module}.py").write_text(TOY.format(cls=cls, name=cls.lower(), origin=line))


def test_a_method_is_registered_by_its_module_alone_listed_by_origin_then_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    toy_package(
        tmp_path, "toyalgos", {"alpha": ("Roam", "roster"), "zeta": ("Base", "baseline"), "beta": ("Pap", "paper")}
    )
    assert list(scan("toyalgos")) == ["pap", "pap-big", "base", "base-big", "roam", "roam-big"]
    assert scan("toyalgos")["roam-big"].family == "roam"


def test_a_method_without_an_origin_or_with_a_taken_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    toy_package(tmp_path, "unplaced", {"alpha": ("Stray", "")})
    with pytest.raises(TypeError, match=r"^Stray: set `origin` to one of paper, baseline, roster$"):
        scan("unplaced")
    toy_package(tmp_path, "twice", {"alpha": ("Same", "roster"), "beta": ("Same", "baseline")})
    with pytest.raises(TypeError, match=r"^same, same-big: two methods take this name"):
        scan("twice")


def test_the_builtin_registry_is_the_scan_of_the_package_in_listing_order():
    assert METHODS == scan("algorithms") and len(METHODS) == 81
    origins = [m.origin for m in METHODS.values()]
    assert origins == sorted(origins, key=algorithms.ORIGINS.index)
    assert list(METHODS)[:3] == ["fedcp", "fedcp-gumbel", "fedcp-nocs"]  # papers first, each with its family
    # every variant and reference form follows the method it belongs to, within its origin
    for name, cls in METHODS.items():
        if cls.family:
            assert list(METHODS).index(cls.family) < list(METHODS).index(name), name
