"""The compile policy, in one room: when `engine=auto` compiles (the rounds that repay compiling, measured on a CPU and
on CUDA: `auto_engine`), how a program is compiled (`compile_program`: fixed shapes, CUDA graphs on a GPU), under
which Inductor configuration and how a failed compile is retried (`Program`, `INDUCTOR_CONFIGS`, remembered for the
process in `NEEDED` and `SHAPES_NEEDED`, the first on disk for later processes too), what ran (`Ran`, so a figure
labelled compiled is never an eager run's) and where the compiled programs are kept (`use_cache`). A program that no
configuration compiles raises to its executor, which goes on eager (tuner/engine/executors.py, `compile_failed`); the
steps
themselves are tuner/engine/steps.py's."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuner.errors import first_sentence
from tuner.files import write_atomic

# Rounds on a CPU from which compiling repays itself: what a round saves depends on how much of it is small
# operations, so the break-even is the backbone's. GPFL's first round (compiling from an empty cache) over what a
# compiled round saves, on the 2-core development machine: the MLP in the small setting (digits) and cnn4 in
# Table 1's, from bench/engine_speed.py (results/bench/compile-rounds-cpu-{mlp,cnn4}.json; a test computes these
# from them). Unmeasured backbones take the largest.
CPU_COMPILE_ROUNDS = {"mlp": 620, "cnn4": 13}


# Rounds on CUDA from which compiling repays itself (GPFL Table 1's setting, torch 2.11): the first round's
# compiling over what a round saves, from the H200 speed stage at 7a0cf86 (results/gpu/check-h200-7a0cf86/speed,
# the first clean run of the four: every timed round compiled nothing; a test computes these from it).
CUDA_COMPILE_ROUNDS = {("gpfl", "cnn4"): 12, ("fedavg", "cnn4"): 16, ("fedcp", "cnn4"): 15, ("fedpac", "pac_cnn"): 58}


# (method, backbone) pairs the GPU checks found to compile on CUDA (every step and batch compiled, every step a
# CUDA graph) and equal the sequential CPU run in float64 (results/gpu: check-h100-7b36476, check-h200-a50e3b0 and
# check-h200-7a0cf86, all on digits with the MLP but FedPer, on ResNet-18; tests/test_gpu_records.py reads them back).
# A backbone is another program: a pair not checked runs eager on CUDA, so the papers' cnn4 columns compile
# under `auto` once bench/gpu_check.py has checked them on cnn4.
CUDA_CHECKED = frozenset(
    {
        (m, "mlp")
        for m in ("fedavg", "gpfl", "fedcp", "fedcp-gumbel", "fedpac", "ditto", "fedrep", "fedem")
        + ("apfl", "apple", "fd", "fedproto", "fedadam", "fedala", "lg-fedavg", "fedamp", "per-fedavg", "fedas")
        + ("feddbe",)
    }
    | {("fedper", "resnet18")}
)

# Methods that fail to compile on CUDA for a reason upstream, each in a line (results/gpu/README.md): they run
# eager there whatever their backbone, until a torch release fixes it.
CUDA_FAILS = {
    "pfedme": "Triton rejects a foreach kernel Inductor generates for its inner loop (NameError: in_ptr8 is not "
    "defined; torch 2.11, results/gpu/h200-9f08411/pfedme.log)",
    "feddyn": "functorch's internal assertion layer.key() == TransformType::Grad in the backward of its linear term "
    "under vmap (torch 2.11, results/gpu/check-h200-7a0cf86/correctness)",
}


def engine_for(asked: str, device: str, rounds: int, backbone: str, method: str, family: str) -> str:
    """The engine a run asking for `asked` (auto, eager or compiled) runs on: auto's rule (`auto_engine`); a method
    of a family that fails to compile on CUDA (CUDA_FAILS) runs eager there, said in one line, rather than spend
    minutes compiling before it goes on eager anyway."""
    fails = CUDA_FAILS.get(family) if device.startswith("cuda") else None
    if asked == "compiled" and fails:
        say(f"{method} runs eager on CUDA: {fails}.")
        return "eager"
    return auto_engine(device, rounds, backbone, method) if asked == "auto" else asked


def auto_engine(device: str, rounds: int, backbone: str, method: str) -> str:
    """Compiled where the rounds that will run its programs repay compiling them, eager elsewhere. `rounds`: a
    run's own, or, in a sweep, those of all the trials one worker runs (they share its programs). On CUDA only
    for the (method, backbone) pairs checked to compile there (CUDA_CHECKED), from their measured break-even
    (CUDA_COMPILE_ROUNDS) or the largest one; on a CPU from the backbone's measured break-even
    (CPU_COMPILE_ROUNDS; docs/performance.md, "Compiling once")."""
    if device.startswith("cuda"):
        if (method, backbone) not in CUDA_CHECKED:
            return "eager"
        needed = CUDA_COMPILE_ROUNDS.get((method, backbone), max(CUDA_COMPILE_ROUNDS.values()))
        return "compiled" if rounds >= needed else "eager"
    return "compiled" if rounds >= CPU_COMPILE_ROUNDS.get(backbone, max(CPU_COMPILE_ROUNDS.values())) else "eager"


# Inductor configurations a program is compiled under, in turn, until one compiles. Loop reordering after fusion
# runs on GPUs only, and there torch 2.11's scheduler fails for most methods' steps (`reorder_loops_by_dep_pair`:
# `assert isinstance(snode, SchedulerNode)`; docs/performance.md, "On a GPU"); with it off they compile.
INDUCTOR_CONFIGS: tuple[tuple[str, dict], ...] = (
    ("torch's default Inductor configuration", {}),
    ("loop ordering after fusion off", {"loop_ordering_after_fusion": False}),
)
# The configuration a program of a name (a method's steps, ...) compiled under on a kind of device after the
# default failed, for the process: a sweep's next trial in the same worker compiles under it at once rather than
# failing again (seconds a trial). Kept on disk too, beside the compile cache (`NEEDED_FILE`, for this torch), so a
# new process, a sweep's next worker, starts from it (the default failed again in every new process on a GPU:
# 15 to 25 s of compiling each).
NEEDED: dict[tuple[str, str], int] = {}
NEEDED_FILE = "pfl-tuner-inductor-configs.json"
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
    compiled_calls: int = 0  # ... in this many calls (a block of `steps_per_call` steps a call)
    eager_steps: int = 0  # ... that ran eagerly (engine=eager, or after compiling failed)
    compiled_batches: int = 0  # evaluation and statistics batches, likewise
    eager_batches: int = 0
    programs: int = 0  # programs dynamo compiled while this run's programs were called
    config: int = 0  # the Inductor configuration (INDUCTOR_CONFIGS) the run compiles under now
    retries: int = 0  # compiles that failed and were tried again under the next configuration
    failed: str = ""  # why compiling failed under every configuration (the run went on eager); "" if it did not
    failure: str = ""  # ... the error's whole text, its last 1500 characters (a subprocess's traceback ends there)
    # calls of programs that run as CUDA graphs (each shape's first two warm up and record; the rest replay)
    graph_calls: int = 0
    # programs CUDA graphs refused (Inductor's count: mutated inputs it does not own, CPU tensors, ...)
    graph_skips: int = 0

    def since(self, earlier: Ran) -> str:
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
        ran.config = max(ran.config, needed_before(name, device.type))

    def __call__(self, *args: Any) -> Any:
        config = self._first_config(args)
        while True:
            try:
                return self._run(config, args)
            except compile_errors() as e:  # nothing was written yet: a failed compile runs nothing
                if config + 1 == len(INDUCTOR_CONFIGS):
                    raise
                config = self._retry(config, e)

    def _first_config(self, args: tuple) -> int:
        """The run's configuration; after a retry (this run's or the process's), the one a shape compiled under
        before it, whose program dynamo keeps for that configuration only."""
        kept = SHAPES_NEEDED.get((self.name, self.device.type))
        if kept and min(kept.values()) < self.ran.config:
            return kept.get(call_shapes(args), self.ran.config)
        return self.ran.config

    def _retry(self, config: int, error: Exception) -> int:
        """The configuration to compile under after `config` failed, kept for the run's later programs."""
        self.ran.config, self.ran.retries = max(self.ran.config, config + 1), self.ran.retries + 1
        say(
            f"Compiling {self.name} failed under {INDUCTOR_CONFIGS[config][0]} ({first_line(error)}); "
            f"compiling again with {INDUCTOR_CONFIGS[self.ran.config][0]}."
        )
        return self.ran.config

    def _run(self, config: int, args: tuple) -> Any:
        """One call under `config`, compiling first where needed; what it compiled is remembered and counted."""
        from torch._dynamo.utils import (
            counters,
        )  # here: importing dynamo costs seconds, and a sweep's process trains nothing

        if config not in self.compiled:
            self.compiled[config] = compile_program(self.fn, self.device, INDUCTOR_CONFIGS[config][1])
        programs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
        out = self.compiled[config](*args)
        if config and NEEDED.get((self.name, self.device.type)) != config:
            remember_needed(self.name, self.device.type, config)  # later runs, here and in new processes, start from it
        compiled = counters["stats"]["unique_graphs"] - programs
        if compiled and config + 1 < len(INDUCTOR_CONFIGS):
            SHAPES_NEEDED.setdefault((self.name, self.device.type), {})[call_shapes(args)] = config
        self.ran.programs += compiled
        if counters["inductor"]["cudagraph_skips"] > skips:
            self.graphed = False
            self.ran.graph_skips += counters["inductor"]["cudagraph_skips"] - skips
        self.ran.graph_calls += self.graphed
        return out


def _needed_on_disk() -> tuple[Path, dict[str, int]]:
    """The file beside torch's compile cache (TORCHINDUCTOR_CACHE_DIR, a sweep's `--compile-cache`) that keeps the
    configuration each program needed, and what it holds ({} when absent or unreadable)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    path = Path(cache_dir()) / NEEDED_FILE
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return path, {}
    return path, known if isinstance(known, dict) else {}


def _needed_key(name: str, device_type: str) -> str:
    return f"{name} | {device_type} | torch {torch.__version__}"  # another torch's Inductor may fail otherwise


def needed_before(name: str, device_type: str) -> int:
    """The configuration a program of this name needed on this kind of device: in this process, else in an earlier
    one with this torch (on disk); 0, the default, when none is known."""
    if (name, device_type) in NEEDED:
        return NEEDED[name, device_type]
    config = _needed_on_disk()[1].get(_needed_key(name, device_type), 0)
    return config if type(config) is int and 0 <= config < len(INDUCTOR_CONFIGS) else 0


def remember_needed(name: str, device_type: str, config: int) -> None:
    """Keep the configuration a program needed, for this process and on disk; a file that cannot be written leaves
    the next process to find it again (an optimisation never fails a run)."""
    NEEDED[name, device_type] = config
    path, known = _needed_on_disk()
    try:
        text = json.dumps({**known, _needed_key(name, device_type): config})

        def write(tmp: Path) -> None:
            tmp.write_text(text)

        write_atomic(path, write)
    except OSError:
        pass


def call_shapes(args: tuple) -> tuple:
    """What tells a call's programs apart: the shapes of its tensors (a program is compiled for fixed shapes)."""
    return tuple(
        tuple((k, v.shape) for k, v in a.items()) if isinstance(a, dict) else getattr(a, "shape", a) for a in args
    )


def compile_errors() -> tuple[type[Exception], ...]:
    """What torch.compile raises when it cannot make a program (no C++ compiler, an unsupported operation, a
    backend's failure); a method's own error raises again in the eager step that follows."""
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor.exc import CppCompileError

    return TorchDynamoException, CppCompileError


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


COMPILE_CACHE = ".compile-cache"  # beside the sweeps of one storage, so later sweeps find their programs compiled


def use_cache(folder: str | Path) -> None:
    """Keep this process's compiled programs in `folder` (torch's on-disk caches), shared by a sweep's trials and
    found again by later sweeps."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read by torch's inductor at each cache look-up
