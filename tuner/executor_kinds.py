"""The two executors: `sequential`, the reference, maps a method's per-client functions one client at a time and
names the hook, round and client of a failure in a method's code; `vectorized` maps them over the whole cohort with
torch.func.vmap. Both share the loops of tuner/executors.py."""

from __future__ import annotations

from collections.abc import Callable

from torch.func import vmap
from torch.utils._pytree import tree_flatten

from algorithms.base import Method
from tuner.data.federated import FederatedData
from tuner.errors import UserError
from tuner.executors import EngineSettings, Executor, MethodFailed, row_of, stack_rows
from tuner.steps import pure_step


class SequentialExecutor(Executor):
    """The reference: one client at a time, no vmap; a failure in the method names where it happened."""

    def mapped(self, fn, in_dims, hook, at):
        def one_by_one(*args):
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

    def compile(self, grad, phase):
        """One program of one client's shapes, called client by client (no padding needed)."""
        return self.one_by_one(self.program(pure_step(grad, phase, self.method.updated_in_place), "steps"), server_at=3)

    def compile_summing(self, fn, hook):
        return self.one_by_one(self.program(fn, hook), server_at=1)

    @staticmethod
    def one_by_one(program: Callable, server_at: int) -> Callable:
        """A one-client program called for each row of its stacked arguments; the server's (argument
        `server_at`) is every client's."""

        def each(*args):
            n = len(tree_flatten(args[0])[0][0])
            return stack_rows(
                [program(*[a if j == server_at else row_of(a, i) for j, a in enumerate(args)]) for i in range(n)]
            )

        return each


class VectorizedExecutor(Executor):
    """The whole cohort at once."""

    def mapped(self, fn, in_dims, hook, at):
        mapped = vmap(fn, in_dims=in_dims, randomness="error")  # a method draws from keys, never from a generator

        def refusing_draws(*args):
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

    def compile(self, grad, phase):
        return self.program(
            pure_step(vmap(grad, in_dims=(0, 0, None, 0, 0), randomness="error"), phase, self.method.updated_in_place),
            "steps",
        )

    def compile_summing(self, fn, hook):
        return self.program(vmap(fn, in_dims=(0, None, 0, 0, 0), randomness="error"), hook)


def make_executor(name: str, method: Method, data: FederatedData, settings: EngineSettings) -> Executor:
    return {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}[name](method, data, settings)
