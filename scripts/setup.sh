#!/usr/bin/env bash
# Set up a fresh machine, then run the main job: FedPer on real Fashion-MNIST in FedPAC's
# setting (20 clients, pac:20), a few minutes on a laptop CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tuner run fedper --dataset fmnist --partition pac:20 --clients 20 --rounds 30 \
    --set backbone=pac_cnn --set batch_size=50 --set lr=0.01 --out results/runs/demo
echo "Per-round metrics: results/runs/demo/metrics.parquet"
