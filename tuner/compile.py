"""When `engine=auto` compiles a run's training steps: where the rounds that will run its programs repay compiling
them, from the break-evens measured on a CPU and on CUDA."""

from __future__ import annotations


# Rounds on a CPU from which compiling repays itself: what a round saves depends on how much of it is small
# operations, so the break-even is the backbone's. Set from runs of bench/compile_once.py (the small setting: GPFL,
# digits, mlp) and bench/engine_speed.py (Table 1's cnn4) on the 2-core development machine at 8357c7e whose output
# was not kept; `--json FILE` on either records a run. Unmeasured backbones take the largest.
CPU_COMPILE_ROUNDS = {"mlp": 350, "cnn4": 40}


# Rounds on CUDA from which compiling repays itself, for the methods and backbones measured to compile there and win
# (GPFL Table 1's setting, torch 2.11): the first round's compiling over what a round saves. GPFL from the H200
# check (results/gpu/check-h200-a50e3b0); FedPAC (its Table 1 setting) from the H100 speed stage
# (results/gpu/speed-h100-ea133d7); FedAvg and FedCP from the first H100 figures (results/gpu/compiled-engine-b9d680f,
# the faster eager figure), their timed rounds in the later files having compiled programs. Anything not measured
# runs eager on CUDA (pFedMe fails to compile there).
CUDA_COMPILE_ROUNDS = {("gpfl", "cnn4"): 14, ("fedavg", "cnn4"): 41, ("fedcp", "cnn4"): 14, ("fedpac", "pac_cnn"): 92}


def auto_engine(device: str, rounds: int, backbone: str, method: str) -> str:
    """Compiled where the rounds that will run its programs repay compiling them, eager elsewhere. `rounds`: a
    run's own, or, in a sweep, those of all the trials one worker runs (they share its programs). On CUDA only
    for the methods and backbones measured to compile and win there (CUDA_COMPILE_ROUNDS); on a CPU from the
    backbone's measured break-even (CPU_COMPILE_ROUNDS; docs/performance.md, "Compiling once")."""
    if device.startswith("cuda"):
        needed = CUDA_COMPILE_ROUNDS.get((method, backbone))
        return "compiled" if needed is not None and rounds >= needed else "eager"
    return "compiled" if rounds >= CPU_COMPILE_ROUNDS.get(backbone, max(CPU_COMPILE_ROUNDS.values())) else "eager"
