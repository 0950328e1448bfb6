"""How a training step runs (`engine`): `eager`, the reference, updates the active prefix of a chunk in place;
`compiled` runs the whole step (forward, backward, the optimizer's update written into the chunk) as one
torch.compile'd program of fixed shapes, the active clients padded to a power of two (so a run compiles at most
log2(cohort) + 1 programs a phase, and none twice), on CUDA with CUDA graphs asked for. A chunk trains in buffers
kept for the process (`ChunkBuffers`), and a program is handed the very tensors marked static, made once a size,
so their addresses stay fixed from step to step and trial to trial: CUDA graphs accept in-place writes only into
such tensors. A program that fails to compile is compiled again under a safer Inductor configuration, then left
to eager (`Program`); `Ran` counts what ran. The executors (tuner/executors.py) choose a step and run it over the
cohort."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch

from algorithms.base import Phase, State
from tuner.errors import first_sentence

# Inductor configurations a program is compiled under, in turn, until one compiles. Loop reordering after fusion
# runs on GPUs only, and there torch 2.11's scheduler fails for most methods' steps (`reorder_loops_by_dep_pair`:
# `assert isinstance(snode, SchedulerNode)`; docs/performance.md, "On a GPU"); with it off they compile.
INDUCTOR_CONFIGS: tuple[tuple[str, dict], ...] = (
    ("torch's default Inductor configuration", {}),
    ("loop ordering after fusion off", {"loop_ordering_after_fusion": False}),
)
# The configuration a program of a name (a method's steps, ...) compiled under on a kind of device after the
# default failed, for the process: a sweep's next trial in the same worker compiles under it at once rather than
# failing again (seconds a trial).
NEEDED: dict[tuple[str, str], int] = {}
# The configuration each shape of a name's programs compiled under, where a later shape's retry may leave it: a
# retry keeps those programs, for the run and for the process's later runs (dynamo keeps a program for its own
# configuration only: called under the retry's, the shape compiles again, 2 programs and 22 s for FedAvg's second
# trial on an H200, results/gpu/README.md).
SHAPES_NEEDED: dict[tuple[str, str], dict[tuple, int]] = {}


@dataclass
class Ran:
    """What a run's engine did, counted as it ran: each round's `engine` column, the tests and the benches read it,
    so that a figure labelled compiled is never an eager run's."""

    compiled_steps: int = 0  # training steps a compiled program ran
    eager_steps: int = 0  # ... that ran eagerly (engine=eager, or after compiling failed)
    compiled_batches: int = 0  # evaluation and statistics batches, likewise
    eager_batches: int = 0
    programs: int = 0  # programs dynamo compiled while this run's programs were called
    config: int = 0  # the Inductor configuration (INDUCTOR_CONFIGS) the run compiles under now
    retries: int = 0  # compiles that failed and were tried again under the next configuration
    failed: str = ""  # why compiling failed under every configuration (the run went on eager); "" if it did not
    failure: str = ""  # ... the error's whole text, its last 1500 characters (a subprocess's traceback ends there)
    graph_calls: int = 0  # calls of programs that run as CUDA graphs (each shape's first two warm up and record; the rest replay)
    graph_skips: int = 0  # programs CUDA graphs refused (Inductor's count: mutated inputs it does not own, CPU tensors, ...)

    def since(self, earlier: "Ran") -> str:
        """How the work counted since `earlier` ran, in a word or three (a round's `engine` column)."""
        compiled = self.compiled_steps + self.compiled_batches - earlier.compiled_steps - earlier.compiled_batches
        eager = self.eager_steps + self.eager_batches - earlier.eager_steps - earlier.eager_batches
        label = "compiled" if self.config == 0 else f"compiled, {INDUCTOR_CONFIGS[self.config][0]}"
        if compiled and eager:
            return f"{label}, then eager"
        return label if compiled else "eager"

    def not_compiled(self) -> str:
        """What of the counted work did not run compiled, as a clause ("" when all of it did): a figure or a check
        labelled compiled is refused on it."""
        if self.failed:
            return f"went on eager: compiling failed ({self.failed})"
        if self.eager_steps or self.eager_batches:
            return f"ran {self.eager_steps} steps and {self.eager_batches} batches eager"
        return "" if self.compiled_steps or self.compiled_batches else "ran nothing compiled"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {first_sentence(error)[:200]}"


class Program:
    """`fn` compiled with fixed shapes (a new shape is a new program of the same wrapper), on CUDA with CUDA graphs,
    under the run's Inductor configuration (`ran.config`). A compile that fails is tried again under the next
    configuration, which the run keeps for its later programs, and the process's later runs for theirs (`NEEDED`);
    the shapes it had compiled before keep their programs (`SHAPES_NEEDED`). After the last configuration, the error
    is raised to the caller, which goes on eager. Counts the programs dynamo compiled and the calls CUDA graphs ran
    or refused."""

    def __init__(self, fn: Callable, device: torch.device, ran: Ran, name: str):
        self.fn, self.device, self.ran, self.name = fn, device, ran, name
        self.compiled: dict[int, Callable] = {}  # fn compiled under each Inductor configuration it has run under
        self.graphed = device.type == "cuda"  # until Inductor counts a skip for this program
        ran.config = max(ran.config, NEEDED.get((name, device.type), 0))

    def __call__(self, *args):
        config = self.ran.config
        kept = SHAPES_NEEDED.get((self.name, self.device.type))
        if kept and min(kept.values()) < config:  # after a retry (this run's or the process's): shapes compiled before it
            config = kept.get(call_shapes(args), config)
        while True:
            if config not in self.compiled:
                self.compiled[config] = compile_program(self.fn, self.device, INDUCTOR_CONFIGS[config][1])
            from torch._dynamo.utils import counters  # here: importing dynamo costs seconds, and a sweep's or report's own process trains nothing

            programs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
            try:
                out = self.compiled[config](*args)
            except compile_errors() as e:  # nothing was written yet: a failed compile runs nothing
                if config + 1 == len(INDUCTOR_CONFIGS):
                    raise
                self.ran.config, self.ran.retries = max(self.ran.config, config + 1), self.ran.retries + 1
                say(f"Compiling {self.name} failed under {INDUCTOR_CONFIGS[config][0]} ({first_line(e)}); "
                    f"compiling again with {INDUCTOR_CONFIGS[self.ran.config][0]}.")  # fmt: skip
                config = self.ran.config
                continue
            if config:  # compiled, under a configuration the default failed for: the process's later runs start from it
                NEEDED[self.name, self.device.type] = config
            compiled = counters["stats"]["unique_graphs"] - programs
            if compiled and config + 1 < len(INDUCTOR_CONFIGS):
                SHAPES_NEEDED.setdefault((self.name, self.device.type), {})[call_shapes(args)] = config
            self.ran.programs += compiled
            if counters["inductor"]["cudagraph_skips"] > skips:
                self.graphed = False
                self.ran.graph_skips += counters["inductor"]["cudagraph_skips"] - skips
            self.ran.graph_calls += self.graphed
            return out


def call_shapes(args: tuple) -> tuple:
    """What tells a call's programs apart: the shapes of its tensors (a program is compiled for fixed shapes)."""
    return tuple(tuple((k, v.shape) for k, v in a.items()) if isinstance(a, dict) else getattr(a, "shape", a) for a in args)


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


def compile_errors() -> tuple[type[Exception], ...]:
    """What torch.compile raises when it cannot make a program (no C++ compiler, an unsupported operation, a
    backend's failure); a method's own error raises again in the eager step that follows."""
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor.exc import CppCompileError

    return TorchDynamoException, CppCompileError


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
            if buffer is None or buffer.shape != (depth, *v.shape[1:]) or buffer.dtype != v.dtype or buffer.device != v.device:
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
                torch._dynamo.mark_static_address(v, guard=False)  # a new address re-records a graph; it never recompiles
        return views[rows]


CHUNKS = ChunkBuffers()


def compile_program(fn: Callable, device: torch.device, config: dict) -> Callable:
    """torch.compile with fixed shapes (a new shape is a new program, never a dynamic one), under the Inductor
    configuration `config`; CUDA graphs on a GPU (what mode="reduce-overhead" asks for).

    Every program of every run shares one code object (pure_step's, or vmap's), and a process running many
    trials of several methods keeps a program per method, phase and padded shape, so dynamo's limit of 8
    programs a code object is raised, and reaching it fails rather than falling back to eager unseen."""
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=False, options={"triton.cudagraphs": device.type == "cuda", **config})
