#!/usr/bin/env bash
# Install everything the project needs on a fresh machine: a virtual environment with the
# Python packages, and Debian's real Fashion-MNIST where apt is available. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
    echo "Installing Debian's dataset-fashion-mnist ..."
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq dataset-fashion-mnist >/dev/null; } \
        || echo "Could not install dataset-fashion-mnist; Fashion-MNIST runs will need --set data_dir=..." >&2
fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    echo "Installing Python packages into .venv (about 2 minutes) ..."
    .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import torch, torchvision, ray, optuna, cvxpy" # fail here, not later, if the install broke
    rm -f .venv/.installed-* && touch "$stamp"
fi
