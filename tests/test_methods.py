"""Every paper method learns, and the contract's own example runs as its docstring shows."""

import pytest
from simulations import sim_for


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gpfl", "fedcp", "fedpac", "fedpac-protoweights"])
def test_method_learns_on_digits(method):
    sim = sim_for(method, 4, clients=5)
    assert sim.history[-1]["best_acc"] > 0.6  # chance is 0.1


def test_the_contracts_ten_line_method_runs_as_its_docstring_shows():
    """algorithms/base.py's docstring defines a method, runs its loss and shows a declaration refused: as doctests."""
    import doctest

    import algorithms.base

    result = doctest.testmod(algorithms.base, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0
