#!/usr/bin/env bash
# Set up a fresh machine, then run the main job: a real sweep (GPFL's λ, μ and learning rate,
# 8 trials with early stopping, on local Ray) on the embedded digits, a few minutes on a laptop
# CPU, followed by `tuner report` over that sweep and the committed Fashion-MNIST reproduction.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
resume=()
if [ -d results/sweeps/demo/search ]; then resume=(--resume); fi   # a second setup continues, never overwrites
.venv/bin/tuner sweep gpfl --space search_spaces/demo.yaml --name demo "${resume[@]}"
.venv/bin/tuner report results/sweeps/demo results/reproduction --out results/report
