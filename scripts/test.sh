#!/usr/bin/env bash
# Run the test suite (installing first on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python -m pytest "$@"
