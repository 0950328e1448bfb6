#!/usr/bin/env bash
# Set up a fresh machine, then run the main job: a real sweep (GPFL's λ, μ and learning rate,
# 8 trials with early stopping, on local Ray) on the embedded digits, a few minutes on a laptop
# CPU, followed by `tuner report` over that sweep and the committed Fashion-MNIST reproductions (8 rounds on a
# CPU, FedPAC's Table 1 at up to its 200 rounds on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
resume=()
if [ -d results/sweeps/demo/search ]; then resume=(--resume); fi   # a second setup continues, never overwrites
.venv/bin/tuner sweep gpfl --space search_spaces/demo.yaml --name demo "${resume[@]}"
.venv/bin/tuner report results/sweeps/demo results/reproduction results/gpu/fedpac-table1-fmnist-h100 --out results/report
