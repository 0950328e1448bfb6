"""How a training step runs (`engine`): `eager`, the reference, runs one step at a time on the active prefix of a
chunk, updated in place; `compiled` runs a block of `steps_per_call` consecutive steps (forward, backward, the
optimizer's update written into the chunk, the batches decoded and the losses summed) as one torch.compile'd
program of fixed shapes, the block's rows those of its first step padded to a power of two (so a run compiles at
most log2(cohort) + 1 programs a phase, and none twice), on CUDA with CUDA graphs asked for: the host calls once
and the GPU replays one graph for the whole block. A client that finishes inside a block, or a padded row, keeps
what it had (`live`). A chunk trains in buffers kept for the process (`ChunkBuffers`), and a program is handed the
very tensors marked static, made once a size, so their addresses stay fixed from step to step and trial to trial:
CUDA graphs accept in-place writes only into such tensors. How a program is compiled, retried and counted is
tuner/engine/compile.py's (`Program`, `Ran`). The executors (tuner/engine/executors.py) choose a step and run it over
the cohort.

A block's inputs are step-major: `xs` (steps, rows, batch, ...) the stored samples of its batches (gathered by the
executor, one gather a block, so the split's size is no shape of a program and a partition never recompiles),
`ys` (steps, rows, batch) their labels, `keys` (steps, rows) the noise keys of a drawing method or None, `live`
(steps, rows) whether each row trains at each step."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.func import grad_and_value

from algorithms.base import State
from algorithms.common import DRAW_KEY
from algorithms.rounds import Phase
from tuner.engine.compile import Ran, compile_errors


class EagerStep:
    """The reference step, a block of one: the active prefix of the chunk's tensors, updated in place."""

    block = 1

    def __init__(self, grad: Callable, phase: Phase, decode: Callable, ran: Ran):
        self.grad, self.optimizer, self.project = grad, phase.optimizer, phase.project
        self.decode, self.ran = decode, ran

    def rows(self, active: int, total: int) -> int:
        return active

    def __call__(
        self,
        params: State,
        opt_state: State,
        rest: State,
        server: State,
        xs: Tensor,
        ys: Tensor,
        keys: Tensor | None,
        live: Tensor | None,
        active: list[int],
    ) -> Tensor:
        self.ran.eager_steps += 1
        if keys is not None:
            rest = {**rest, DRAW_KEY: keys[0]}
        g, loss = self.grad(params, rest, server, self.decode(xs[0]), ys[0])
        self.optimizer.for_rows(rest, server).step(params, g, opt_state)
        if self.project is not None:
            for k, v in self.project(params).items():
                params[k].copy_(v)
        return loss


def step_gradient(phase: Phase, loss: Callable) -> Callable:
    """One client's gradient of a phase's loss and the loss: grad(params, rest, server, x, y), each step's
    gradient clipped first where the phase clips it (as clip_grad_norm_ scales it, a group at a time)."""

    def f(params: State, rest: State, server: State, x: Tensor, y: Tensor) -> Tensor:
        return loss({**rest, **params}, server, x, y)

    if phase.clip is None:
        return grad_and_value(f)
    limit = phase.clip

    def clipped(params: State, rest: State, server: State, x: Tensor, y: Tensor) -> tuple[State, Tensor]:
        g, value = grad_and_value(f)(params, rest, server, x, y)
        out: State = {}
        for group in phase.clip_groups or (tuple(g),):
            part = {k: v for k, v in g.items() if k.startswith(group)}
            norm = torch.sqrt(sum((v**2).sum() for v in part.values()))
            scale = torch.clamp(limit / (norm + 1e-6), max=1.0)
            out |= {k: v * scale for k, v in part.items()}
        return out, value

    return clipped


def pure_step(grad: Callable, phase: Phase, in_place: Callable[[str], bool]) -> Callable:
    """A step of one client's tensors or a stack of them (grad mapped over it) that writes its new parameters,
    optimizer state and BatchNorm statistics into them and returns the loss; a row that is not `active` (a
    padded row of a compiled cohort) keeps what it had and adds 0 to the loss. Compiled, the writes land in
    the inputs' own memory: nothing is copied back after the program."""

    def step(
        params: State, opt_state: State, rest: State, server: State, x: Tensor, y: Tensor, active: Tensor
    ) -> Tensor:
        stats = {k: v.clone() for k, v in rest.items() if in_place(k)}  # the forward updates these in place
        g, loss = grad(params, {**rest, **stats}, server, x, y)
        new_params, new_opt = {k: v.clone() for k, v in params.items()}, {k: v.clone() for k, v in opt_state.items()}
        phase.optimizer.for_rows(rest, server).step(new_params, g, new_opt)
        if phase.project is not None:
            new_params.update(phase.project(new_params))
        for new, old in ((new_params, params), (new_opt, opt_state), (stats, rest)):
            for k, v in new.items():
                old[k].copy_(torch.where(active.view(active.shape + (1,) * (v.dim() - active.dim())), v, old[k]))
        return torch.where(active, loss, torch.zeros_like(loss))

    return step


def block_of_steps(step: Callable, size: int, decode: Callable) -> Callable:
    """`size` consecutive steps (pure_step's) as one function of a block's inputs (the module's docstring): each
    step decodes its batch, trains the rows `live` at it and adds their losses, in float64, to the block's."""

    def block(
        params: State,
        opt_state: State,
        rest: State,
        server: State,
        xs: Tensor,
        ys: Tensor,
        keys: Tensor | None,
        live: Tensor,
    ) -> Tensor:
        losses = []
        for j in range(size):  # in order: each step trains from the one before
            mine = rest if keys is None else {**rest, DRAW_KEY: keys[j]}
            losses.append(step(params, opt_state, mine, server, decode(xs[j]), ys[j], live[j]).double())
        return sum(losses[1:], losses[0])

    return block


class CompiledStep:
    """A block of steps as a compiled `Program` of fixed shapes (or the sequential executor's calls of one), one
    per number of rows, updating the chunk in place.
    Where no Inductor configuration compiles it, it hands the steps to `fallback` (Executor.compile_failed: the
    run goes on eager, a step at a time)."""

    def __init__(self, program: Callable, block: int, pad: bool, fallback: Callable, ran: Ran):
        self.program, self.block, self.pad, self.fallback, self.ran = program, block, pad, fallback, ran
        self.eager: EagerStep | None = None  # the step that took over after a failed compile
        self.shapes: set[int] = set()  # the rows run: each should compile once (tests, bench)

    def rows(self, active: int, total: int) -> int:
        return padded_rows(active, total) if self.pad else active

    def __call__(
        self,
        params: State,
        opt_state: State,
        rest: State,
        server: State,
        xs: Tensor,
        ys: Tensor,
        keys: Tensor | None,
        live: Tensor,
        active: list[int],
    ) -> Tensor:
        """The block's steps; `active`: how many rows train at each of its steps (its real ones, fewer than the
        block's at the end of a schedule)."""
        self.shapes.add(len(live[0]))
        if self.eager is None:
            try:
                loss = self.program(params, opt_state, rest, server, xs, ys, keys, live)
                self.ran.compiled_steps += len(active)
                self.ran.compiled_calls += 1
                return loss
            except compile_errors() as e:  # nothing was written yet: the steps run again eagerly
                self.eager = self.fallback(e)
        total = torch.zeros(len(live[0]), dtype=torch.float64, device=live.device)
        for j, a in enumerate(active):
            head = lambda d: {k: v[:a] for k, v in d.items()}  # noqa: E731, B023
            step = slice(j, j + 1)
            keys_j = None if keys is None else keys[step, :a]
            loss = self.eager(
                head(params), head(opt_state), head(rest), server, xs[step, :a], ys[step, :a], keys_j, None, [a]
            )
            total[:a] += loss.detach()
        return total


def padded_rows(active: int, total: int) -> int:
    """Rows a compiled program runs for `active` clients: the next power of two, at most the chunk."""
    return min(total, 1 << (active - 1).bit_length())


class ChunkBuffers:
    """The tensors a chunk trains in, one buffer a state key as deep as the federation, kept for the process, and
    views of their first rows, made once a number of rows and marked static: a step is handed these very tensors,
    so their addresses stay fixed from step to step, round to round and trial to trial (a sweep's trials share a
    worker), and CUDA graphs may write into them (graph trees accept in-place writes only into inputs marked
    static, checked on the tensor object: a slice made anew is another object, without the mark). A group's
    buffers of other keys or shapes (another run's) are dropped with their views."""

    def __init__(self) -> None:
        self.groups: dict[str, State] = {}
        self.views: dict[str, dict[int, State]] = {}

    def take(self, like: State, rows: int, depth: int, group: str = "state", copy: bool = False) -> State:
        """The group's first `rows` rows (`view`), its buffers shaped like `like`'s tensors (rows of clients),
        holding `like`'s values if `copy`."""
        old, new = self.groups.get(group, {}), {}
        for k, v in like.items():
            buffer = old.get(k)
            if (
                buffer is None
                or buffer.shape != (depth, *v.shape[1:])
                or buffer.dtype != v.dtype
                or buffer.device != v.device
            ):
                buffer = torch.empty((depth, *v.shape[1:]), dtype=v.dtype, device=v.device)
            new[k] = buffer
        if new.keys() != old.keys() or any(new[k] is not old[k] for k in new):
            self.views[group] = {}
        self.groups[group] = new
        out = self.view(group, rows)
        if copy:
            for k, v in out.items():
                v.copy_(like[k])
        return out

    def view(self, group: str, rows: int) -> State:
        """The first `rows` rows of the group's buffers: the same tensor objects at every call, marked static."""
        views = self.views.setdefault(group, {})
        if rows not in views:
            views[rows] = {k: b[:rows] for k, b in self.groups[group].items()}
            for v in views[rows].values():
                # a new address re-records a graph; it never recompiles
                torch._dynamo.mark_static_address(v, guard=False)
        return views[rows]


CHUNKS = ChunkBuffers()
