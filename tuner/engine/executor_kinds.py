"""The two executors: `sequential`, the reference, maps a method's per-client functions one client at a time and
names the hook, round and client of a failure in a method's code; `vectorized` maps them over the whole cohort with
torch.func.vmap. Both share the loops of tuner/engine/executors.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.func import vmap
from torch.utils._pytree import tree_flatten

from algorithms.base import Method
from algorithms.rounds import Phase, Round
from tuner.data.federated import FederatedData
from tuner.engine.executors import EngineSettings, Executor, MethodFailed, own_strides, row_of, stack_rows
from tuner.engine.steps import pure_step
from tuner.errors import UserError


class SequentialExecutor(Executor):
    """The reference: one client at a time, no vmap; a failure in the method names where it happened."""

    def mapped(self, fn: Callable, in_dims: tuple, hook: str, at: Round) -> Callable:
        def one_by_one(*args: Any) -> Any:
            rows = []
            n = tree_flatten(next(a for a, d in zip(args, in_dims, strict=True) if d is not None))[0][0].shape[0]
            for i in range(n):
                # views: in-place updates land
                mine = [a if d is None else row_of(a, i) for a, d in zip(args, in_dims, strict=True)]
                try:
                    rows.append(fn(*mine))
                except Exception as e:  # the client's id is read only here: no host sync per step
                    client = int(at.clients[i])
                    raise MethodFailed(
                        f"{type(self.method).__name__}.{hook} failed in round {at.number} for client {client}: {e}"
                    ) from e
            return stack_rows(rows)

        return one_by_one

    pads = False

    def compile(self, grad: Callable, phase: Phase) -> Callable:
        return pure_step(grad, phase, self.method.updated_in_place)

    def block_program(self, block: Callable) -> Callable:
        """One program of one client's shapes, called client by client (no padding needed); a block's inputs are
        step-major, its rows along dim 1."""
        return self.one_by_one(self.program(block, "steps"), dims=(0, 0, 0, None, 1, 1, 1, 1))

    def compile_summing(self, fn: Callable, hook: str) -> Callable:
        return self.one_by_one(self.program(fn, hook), dims=(0, None, 0, 0, 0))

    @staticmethod
    def one_by_one(program: Callable, dims: tuple) -> Callable:
        """A one-client program called for each row of its stacked arguments, a row along the argument's dim in
        `dims` (None: every client's, the server's); an argument that is None (no noise keys) stays None. Rows
        along dim 1 (a block's inputs) are made rows along dim 0 first, so each client's slice has the strides
        of its own shape, whatever the chunk's size (a program is compiled for its inputs' strides)."""

        def each(*args: Any) -> Any:
            args = tuple(
                own_strides(a.movedim(1, 0)) if d == 1 and a is not None else a for a, d in zip(args, dims, strict=True)
            )
            n = next(len(tree_flatten(a)[0][0]) for a, d in zip(args, dims, strict=True) if d == 0)
            return stack_rows(
                [
                    program(*[a if d is None or a is None else row_of(a, i) for a, d in zip(args, dims, strict=True)])
                    for i in range(n)
                ]
            )

        return each


class VectorizedExecutor(Executor):
    """The whole cohort at once."""

    def mapped(self, fn: Callable, in_dims: tuple, hook: str, at: Round) -> Callable:
        mapped = vmap(fn, in_dims=in_dims, randomness="error")  # a method draws from keys, never from a generator

        def refusing_draws(*args: Any) -> Any:
            try:
                return mapped(*args)
            except RuntimeError as e:
                if "randomness error mode" not in str(e):
                    raise
                raise UserError(
                    f"{type(self.method).__name__}.{hook} draws random numbers from torch's generator (a "
                    "Dropout in the backbone?), which "
                    "differs between devices and cannot be vectorized; draw keyed noise (docs/engine.md) or "
                    "use executor=sequential."
                ) from None

        return refusing_draws

    def compile(self, grad: Callable, phase: Phase) -> Callable:
        return pure_step(
            vmap(grad, in_dims=(0, 0, None, 0, 0), randomness="error"), phase, self.method.updated_in_place
        )

    def block_program(self, block: Callable) -> Callable:
        return self.program(block, "steps")

    def compile_summing(self, fn: Callable, hook: str) -> Callable:
        return self.program(vmap(fn, in_dims=(0, None, 0, 0, 0), randomness="error"), hook)


def make_executor(name: str, method: Method, data: FederatedData, settings: EngineSettings) -> Executor:
    return {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}[name](method, data, settings)
