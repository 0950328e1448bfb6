"""The executors: one training loop and one summing loop over a cohort whose client states are stacked along dim 0,
mapped one client at a time (`sequential`, the reference, which names the hook, round and client of a failure in a
method's code) or all at once with torch.func.vmap (`vectorized`). Clients with fewer batches drop out of a step: the
cohort is sorted by step count, so the clients still active are always a prefix of the stack. A chunk of the cohort
trains in buffers kept for the process (`ChunkBuffers`), so its tensors keep their addresses.

A training step runs eager or compiled, a block of `steps_per_call` steps a program (tuner/engine/steps.py, compiled
as tuner/engine/compile.py says); an evaluation batch likewise, compiled over the whole chunk (clients past their
last sample weigh 0). The method's and the run's floats are inputs of the programs
(algorithms.base.hyperparameter_inputs), so a sweep's next trial compiles nothing. Both engines give the same numbers
(tests hold them equal in float64); a program that cannot be compiled leaves the run to eager."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from algorithms.base import Method, State
from algorithms.common import DRAW_KEY
from algorithms.rounds import IGNORED, Phase, Round
from tuner.data.augment import crop_flip
from tuner.data.federated import FederatedData, Split
from tuner.engine.compile import Program, Ran, compile_errors, first_line, say
from tuner.engine.draws import PADDED, draw_keys
from tuner.engine.phases import PhasePlan, chunk_schedule, plan_phase
from tuner.engine.steps import CHUNKS, CompiledStep, EagerStep, block_of_steps, step_gradient
from tuner.errors import OutOfMemory

EXECUTORS = ("vectorized", "sequential")
ENGINES = ("eager", "compiled")


@dataclass
class EngineSettings:
    """How the engine runs the method (the training settings themselves are the method's `Training`)."""

    seed: int = 0
    join_ratio: tuple[float, float] = (1.0, 1.0)  # fixed when equal, else drawn uniformly each round
    eval_gap: int = 1
    executor: str = "vectorized"
    engine: str = "eager"  # how a training step runs: eager (the reference) or compiled
    cohort_chunk: int = 0  # clients per step; 0 = the whole cohort
    steps_per_call: int = 1  # training steps a compiled program runs at a call (a block)
    eval_batch: int = 256  # samples per client per evaluation step
    augment: bool = False  # random crop + flip of training images (tuner/data/augment.py)
    full_last_round: bool = False  # every client takes part in the last round (FedPAC §5)
    # a pack's runs (tuner/engine/pack.py): each run's seed, its clients rows run·N .. run·N + N - 1; () alone
    pack_seeds: tuple[int, ...] = ()


def float_type(states: State) -> torch.dtype:
    """The run's float type (float32, or float64 for exact comparisons), read off its states."""
    return next(v.dtype for v in states.values() if v.is_floating_point())


def stack_rows(rows: list[Any]) -> Any:
    """Per-client results (dicts or tuples of tensors) stacked along a new dim 0, as vmap returns them."""
    columns = zip(*[tree_flatten(r)[0] for r in rows], strict=True)
    return tree_unflatten([torch.stack(c) for c in columns], tree_flatten(rows[0])[1])


def row_of(tree: Any, i: int) -> Any:
    """Row i of every tensor of a stacked tree: views, so in-place updates land in the stack."""
    return tree_map(lambda t: t[i], tree)


def own_strides(t: torch.Tensor) -> torch.Tensor:
    """A copy of a slice with the strides of its own shape: a slice keeps the chunk's (even where its dims of size
    1 make it contiguous), and a program is compiled for its inputs' strides, so a chunk of another size would
    compile it again."""
    return t.clone(memory_format=torch.contiguous_format)


class MethodFailed(RuntimeError):
    """A method's code raised; the sequential executor names the hook, the round and the client."""


class Executor:
    """Runs the method's per-client functions over a cohort whose states are stacked along dim 0."""

    def __init__(self, method: Method, data: FederatedData, settings: EngineSettings):
        self.method = method
        self.data = data
        self.settings = settings
        self.compiled: dict[tuple, CompiledStep] = {}
        self.summing: dict[str, Callable] = {}  # compiled evaluation programs, by hook
        self.summing_shapes: dict[str, set] = {}  # ... and the shapes they ran
        self.ran = Ran()

    def draw_id(self, row: int) -> tuple[int, int]:
        """The (seed, client) a cohort row's draws are keyed by: the run's seed and the client's id, a packed row's
        those of its own run (so it draws what it draws alone)."""
        seeds = self.settings.pack_seeds
        if not seeds:
            return self.settings.seed, row
        clients = self.data.num_clients // len(seeds)
        return seeds[row // clients], row % clients

    def mapped(self, fn: Callable, in_dims: tuple, hook: str, at: Round) -> Callable:
        """fn applied to each row of the arguments whose in_dim is 0, stacked; row i is client `at.clients[i]`
        (the active clients, a prefix of them, may be fewer)."""
        raise NotImplementedError

    def map(self, fn: Callable, states: State, server: State, *args: Tensor, hook: str, at: Round) -> Any:
        """fn(state_i, server, *args_i) for every client of the stack."""
        return self.mapped(fn, (0, None, *[0] * len(args)), hook, at)(states, server, *args)

    def chunked(self, n: int, run_chunk: Callable[[range], None]) -> None:
        """Run run_chunk over consecutive ranges of clients; on CUDA out-of-memory, halve the range and retry.

        run_chunk writes its results only once it has finished, so a failed attempt leaves no trace.
        """
        start = 0
        while start < n:
            size = self.settings.cohort_chunk or n
            part = range(start, min(start + size, n))
            try:
                run_chunk(part)
            except torch.cuda.OutOfMemoryError:
                if size == 1:
                    raise OutOfMemory(
                        "CUDA ran out of memory training one client at a time; use a smaller backbone, "
                        "batch_size or eval_batch, or a GPU with more memory."
                    ) from None
                self.settings.cohort_chunk = max(1, size // 2)  # kept for the rest of the run
                torch.cuda.empty_cache()
                continue
            start = part.stop

    def step(self, phase: Phase, trains: list[str], at: Round) -> EagerStep | CompiledStep:
        """The training step of a phase. A compiled one is made once per phase and kept for the run: a new
        program each round would recompile (tests count the compilations)."""
        grad = step_gradient(phase, phase.loss or self.method.loss)

        def eager() -> EagerStep:
            return EagerStep(self.mapped(grad, (0, 0, None, 0, 0), "loss", at), phase, self.data.decode, self.ran)

        if self.settings.engine == "eager":
            return eager()
        key = (phase, tuple(trains))
        if key not in self.compiled:

            def fallback(error: Exception) -> EagerStep:
                self.compile_failed(error)
                return eager()

            size = self.settings.steps_per_call
            block = block_of_steps(self.compile(grad, phase), size, self.data.decode)
            self.compiled[key] = CompiledStep(self.block_program(block), size, self.pads, fallback, self.ran)
        return self.compiled[key]

    pads: bool = True  # compiled programs run a stack of clients, padded (else one client's shape)

    def compile(self, grad: Callable, phase: Phase) -> Callable:
        """The pure step (tuner/engine/steps.py) of the executor's shapes: a stack of clients, or one."""
        raise NotImplementedError

    def block_program(self, block: Callable) -> Callable:
        """A block of steps (tuner/engine/steps.py, block_of_steps) as the executor's compiled program."""
        raise NotImplementedError

    def program(self, fn: Callable, what: str) -> Program:
        """fn as a compiled program of the run (its failures and what it ran counted in `ran`)."""
        return Program(fn, self.data.train.y.device, self.ran, f"{type(self.method).__name__}'s {what}")

    def compile_failed(self, error: Exception) -> None:
        """No Inductor configuration compiled a program: the run goes on eager, saying so once; an optimisation
        never fails a run."""
        if self.settings.engine == "compiled":
            self.ran.failed, self.ran.failure = first_line(error), str(error)[-1500:]
            say(
                f"Compiling {type(self.method).__name__}'s programs failed ({self.ran.failed}); the run goes "
                "on with engine=eager."
            )
            self.settings.engine = "eager"

    def shapes_compiled(self) -> int:
        """Distinct (step, rows) programs the run has needed: what dynamo should have compiled, once each."""
        # sequential: one client's shape
        steps = sum(len(step.shapes) if step.pad else 1 for step in self.compiled.values())
        return steps + sum(len(shapes) for shapes in self.summing_shapes.values())

    def _batch_block(self, index: Tensor, draws: Tensor | None, partial: bool) -> tuple[Tensor, Tensor]:
        """The stored samples and labels of a block of steps' batches (`index`: their rows of the split), augmented
        where the run augments; decoding is the step's. `partial`: a padded slot (PADDED) of a partial batch takes
        sample 0 and the label IGNORED."""
        train = self.data.train
        padded = index == PADDED if partial else None
        if padded is not None:
            index = index.masked_fill(padded, 0)
        x, y = train.x[index], train.y[index]
        return x if draws is None else crop_flip(x, draws), y if padded is None else y.masked_fill(padded, IGNORED)

    def _trainable(self, phase: Phase, state: State) -> list[str]:
        """A phase trains every floating tensor under its prefixes except BatchNorm statistics."""
        net = self.method.net
        return [
            k for k, v in state.items() if k.startswith(phase.trains) and not net.is_buffer(k) and v.is_floating_point()
        ]

    def train(self, phases: list[Phase], cohort: State, server: State, at: Round, stream_base: int) -> torch.Tensor:
        """Train the stacked cohort in place, a step of every active client at a time; returns each client's
        mean minibatch loss."""
        device = self.data.train.y.device
        losses = torch.zeros(len(at.clients), dtype=torch.float64, device=device)
        steps = torch.zeros(len(at.clients), device=device)
        self.method.net.module.train()
        for number, phase in enumerate(phases):
            keys, batch = self._trainable(phase, cohort), phase.batch or self.method.training.batch_size
            plan = plan_phase(
                phase,
                number,
                keys,
                batch,
                at,
                stream_base + number,
                [self.draw_id(i) for i in at.clients.tolist()],
                self.settings.augment,
                self.data.train.counts,
                self.method.draws,
            )
            self.chunked(len(at.clients), partial(self._train_chunk, plan, cohort, server, at, losses, steps))
        return (losses / steps.clamp(min=1)).cpu()

    def _train_chunk(
        self, plan: PhasePlan, cohort: State, server: State, at: Round, losses: Tensor, steps: Tensor, part: range
    ) -> None:
        """A chunk of the cohort through its phase: its clients' tensors into the chunk's buffers, its steps, and
        back; each client's summed loss and step count added."""
        train, device = self.data.train, self.data.train.y.device
        ids = at.clients.tolist()
        # the largest chunk a run can have: one set of buffers
        depth = min(self.settings.cohort_chunk or self.data.num_clients, self.data.num_clients)
        order = sorted(part, key=lambda j: -len(plan.scheds[j]))  # most steps first
        n_steps = [len(plan.scheds[j]) for j in order]
        if n_steps[0] == 0:
            return
        order_t = torch.tensor(order, device=device)
        step = self.step(plan.phase, plan.keys, replace(at, clients=at.clients[order_t]))  # row i: client order[i]
        schedule = chunk_schedule(plan, order, [train.starts[i] for i in ids], step.block, device)
        active = [sum(1 for c in n_steps if c > t) for t in range(n_steps[0])]
        tensors = CHUNKS.take(cohort, len(order), depth)
        for k, v in cohort.items():
            torch.index_select(v, 0, order_t, out=tensors[k])
        optimizer = f"optimizer {plan.number}"
        CHUNKS.take(
            plan.phase.optimizer.init({k: tensors[k] for k in plan.keys}), len(order), depth, optimizer, copy=True
        )
        chunk_loss = torch.zeros(len(order), dtype=torch.float64, device=device)

        # the same tensors at every step: static for CUDA graphs
        def chunk_rows(rows: int) -> tuple[State, State, State]:
            state = CHUNKS.view("state", rows)
            return (
                {k: state[k] for k in plan.keys},
                CHUNKS.view(optimizer, rows),
                {k: v for k, v in state.items() if k not in plan.keys},
            )

        self.run_steps(step, active, chunk_rows, server, schedule, chunk_loss, plan.phase.share is not None)
        for k, v in tensors.items():
            cohort[k][order_t] = v
        losses[order_t] += chunk_loss
        steps[order_t] += torch.tensor(n_steps, dtype=steps.dtype, device=device)

    def run_steps(
        self,
        step: EagerStep | CompiledStep,
        active: list[int],
        chunk_rows: Callable[[int], tuple[State, State, State]],
        server: State,
        schedule: tuple,
        chunk_loss: Tensor,
        partial: bool,
    ) -> None:
        """The chunk's steps, a block (`step.block` of them) at a time: a block trains the `active[t]` first rows
        of its first step t (padded for a compiled step), those still live at each of its steps, on their rows of
        the schedule (index, augmentation draws, noise keys, live: step-major); the chunk's tensors
        (`chunk_rows(rows)`: parameters, optimizer state, the rest) are updated in place, each client's losses
        summed in chunk_loss. `partial`: the schedule keeps partial batches, whose padded slots take any sample and
        the label IGNORED."""
        index, aug, key, live = schedule
        total, views = len(chunk_loss), {}
        for t in range(0, len(active), step.block):
            rows = step.rows(active[t], total)
            if rows not in views:
                views[rows] = chunk_rows(rows)
            params, opt_state, rest = views[rows]
            block = slice(t, t + step.block)
            xs, ys = self._batch_block(index[block, :rows], None if aug is None else aug[block, :rows], partial)
            keys = None if key is None else own_strides(key[block, :rows])
            loss = step(params, opt_state, rest, server, xs, ys, keys, own_strides(live[block, :rows]), active[block])
            chunk_loss[:rows] += loss.detach()  # no host sync per step

    def summer(self, fn: Callable, hook: str, at: Round) -> tuple[Callable, bool]:
        """fn mapped over a stack of clients for sum_over, and whether it runs the whole chunk at every batch: on
        the compiled engine one program per hook and batch shape, kept for the run (an evaluation is one forward
        pass, so padding costs less than compiling a program per number of active clients would; a program that
        cannot be compiled hands the run to eager)."""
        mapped = self.mapped(fn, (0, None, 0, 0, 0), hook, at)
        if self.settings.engine == "eager":
            return mapped, False
        if hook not in self.summing:
            self.summing[hook] = self.compile_summing(fn, hook)
        program, shapes = self.summing[hook], self.summing_shapes.setdefault(hook, set())

        def summed(state: State, server: State, x: Tensor, y: Tensor, w: Tensor) -> State:
            if self.settings.engine == "compiled":  # until a program fails to compile
                # one program each: (clients, samples), or one client's
                shapes.add(tuple(y.shape) if self.pads else tuple(y.shape[1:]))
                try:
                    out = program(state, server, x, y, w)
                    self.ran.compiled_batches += 1
                    return out
                except compile_errors() as e:
                    self.compile_failed(e)
            self.ran.eager_batches += 1
            return mapped(state, server, x, y, w)

        return summed, self.pads

    def compile_summing(self, fn: Callable, hook: str) -> Callable:
        raise NotImplementedError

    @torch.no_grad()
    def sum_over(
        self,
        fn: Callable,
        states: State,
        server: State,
        split: Split,
        hook: str,
        at: Round,
        stream: int,
        multiple: int = 1,
    ) -> State:
        """Sum fn(state, server, x, y, w) over each client's samples of a split, eval_batch at a time (rounded down to a
        multiple of `multiple`, so that batches of that size lie whole in one call); padded samples carry w = 0. A
        drawing method's state holds a key per client and batch (`stream`)."""
        self.method.net.module.eval()
        device = split.y.device
        ids = at.clients.tolist()
        results: dict[int, State] = {}

        def run_chunk(part: range) -> None:
            rows = sorted(part, key=lambda j: -split.counts[ids[j]])  # longest first: active clients are a prefix
            rows_t = torch.tensor(rows, device=device)
            clients = at.clients[rows_t]
            state = {k: v[rows_t] for k, v in states.items()}
            counts = [split.counts[ids[j]] for j in rows]
            width = min(self.settings.eval_batch, max(counts[0], 1))  # no wider than the largest client: padding costs
            width = max(multiple, width // multiple * multiple)
            starts = range(0, max(counts[0], 1), width)
            if self.method.draws:
                keyed = [self.draw_id(ids[j]) for j in rows]
                state[DRAW_KEY] = torch.stack(
                    [draw_keys(seed, at.number, stream, client, len(starts)) for seed, client in keyed]
                ).to(device)
            summed, pad = self.summer(fn, hook, replace(at, clients=clients))  # row i: clients[i]
            total: State = {}
            for b, start in enumerate(starts):
                a = max(1, sum(1 for c in counts if c > start))
                # compiled: the whole chunk, one program a split; a client past its last sample has w = 0
                n = len(rows) if pad else a
                index, mask = split.padded_index(clients[:n], start, width)
                batch_state = {k: v[:n, b] if k == DRAW_KEY else v[:n] for k, v in state.items()}
                part_out = summed(
                    batch_state, server, self.data.decode(split.x[index]), split.y[index], mask.to(float_type(states))
                )
                if not total:
                    total = {
                        k: torch.zeros(len(rows), *v.shape[1:], dtype=v.dtype, device=device)
                        for k, v in part_out.items()
                    }
                for k, v in part_out.items():
                    total[k][:n] += v
            for r, j in enumerate(rows):
                results[j] = {k: v[r] for k, v in total.items()}

        self.chunked(len(ids), run_chunk)
        return stack_rows([results[j] for j in range(len(ids))])
