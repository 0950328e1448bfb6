"""How a training step runs (`engine`): `eager`, the reference, updates the active prefix of a chunk in place;
`compiled` runs the whole step (forward, backward, the optimizer's update written into the chunk) as one
torch.compile'd program of fixed shapes, the active clients padded to a power of two (so a run compiles at most
log2(cohort) + 1 programs a phase, and none twice), on CUDA with CUDA graphs asked for. A chunk trains in buffers
kept for the process (`ChunkBuffers`), and a program is handed the very tensors marked static, made once a size,
so their addresses stay fixed from step to step and trial to trial: CUDA graphs accept in-place writes only into
such tensors. How a program is compiled, retried and counted is tuner/compile.py's (`Program`, `Ran`). The
executors (tuner/executors.py) choose a step and run it over the cohort."""

from __future__ import annotations

from collections.abc import Callable

import torch

from algorithms.base import State
from algorithms.rounds import Phase
from tuner.compile import Ran, compile_errors


class EagerStep:
    """The reference step: the active prefix of the chunk's tensors, updated in place."""

    def __init__(self, grad: Callable, phase: Phase, ran: Ran):
        self.grad, self.optimizer, self.project, self.ran = grad, phase.optimizer, phase.project, ran

    def rows(self, active: int, total: int) -> int:
        return active

    def __call__(self, params: State, opt_state: State, rest: State, server: State, x, y, active: int) -> torch.Tensor:
        self.ran.eager_steps += 1
        g, loss = self.grad(params, rest, server, x, y)
        self.optimizer.step(params, g, opt_state)
        if self.project is not None:
            for k, v in self.project(params).items():
                params[k].copy_(v)
        return loss


def pure_step(grad: Callable, phase: Phase, in_place: Callable[[str], bool]) -> Callable:
    """A step of one client's tensors or a stack of them (grad mapped over it) that writes its new parameters,
    optimizer state and BatchNorm statistics into them and returns the loss; a row that is not `active` (a
    padded row of a compiled cohort) keeps what it had and adds 0 to the loss. Compiled, the writes land in
    the inputs' own memory: nothing is copied back after the program."""

    def step(params, opt_state, rest, server, x, y, active):
        stats = {k: v.clone() for k, v in rest.items() if in_place(k)}  # the forward updates these in place
        g, loss = grad(params, {**rest, **stats}, server, x, y)
        new_params, new_opt = {k: v.clone() for k, v in params.items()}, {k: v.clone() for k, v in opt_state.items()}
        phase.optimizer.step(new_params, g, new_opt)
        if phase.project is not None:
            new_params.update(phase.project(new_params))
        for new, old in ((new_params, params), (new_opt, opt_state), (stats, rest)):
            for k, v in new.items():
                old[k].copy_(torch.where(active.view(active.shape + (1,) * (v.dim() - active.dim())), v, old[k]))
        return torch.where(active, loss, torch.zeros_like(loss))

    return step


class CompiledStep:
    """The step as a compiled `Program` of fixed shapes (or the sequential executor's calls of one), one per number
    of rows, updating the chunk in place.
    Where no Inductor configuration compiles it, it hands the step to `fallback` (Executor.compile_failed: the
    run goes on eager)."""

    def __init__(self, program: Callable, pad: bool, fallback: Callable, ran: Ran):
        self.program, self.pad, self.fallback, self.ran = program, pad, fallback, ran
        self.eager: EagerStep | None = None  # the step that took over after a failed compile
        self.masks: dict[tuple, torch.Tensor] = {}  # also the shapes run: each should compile once (tests, bench)

    def rows(self, active: int, total: int) -> int:
        return padded_rows(active, total) if self.pad else active

    def __call__(self, params, opt_state, rest, server, x, y, active):
        rows = len(y)
        key = (rows, active, y.device)
        if key not in self.masks:
            self.masks[key] = torch.arange(rows, device=y.device) < active
        if self.eager is None:
            try:
                loss = self.program(params, opt_state, rest, server, x, y, self.masks[key])
                self.ran.compiled_steps += 1
                return loss
            except compile_errors() as e:  # nothing was written yet: the step runs again eagerly on the active rows
                self.eager = self.fallback(e)
        head = lambda d: {k: v[:active] for k, v in d.items()}  # noqa: E731
        loss = self.eager(head(params), head(opt_state), head(rest), server, x[:active], y[:active], active)
        return torch.cat([loss, loss.new_zeros(rows - active)])


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

    def __init__(self):
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
