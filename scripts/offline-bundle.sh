#!/usr/bin/env bash
# Gather, on a machine with internet, everything a machine without it needs to run this project: the Python
# wheels of its packages (for the other machine's Python and platform) and the datasets, in one folder to copy
# over. There, `PIP_NO_INDEX=1 PIP_FIND_LINKS=BUNDLE/wheels bash scripts/setup.sh` installs from it
# (docs/running.md, "On a machine without internet"; BUNDLE/README.txt says the same).
#
#   bash scripts/offline-bundle.sh BUNDLE [--python 3.12] [--platform manylinux_2_28_x86_64]
#                                         [--data fmnist,cifar10] [--requirements FILE]
#
# --python      the other machine's Python (default: this machine's python3)
# --platform    its wheel platform (default: manylinux_2_28_x86_64, and the older manylinux tags it accepts)
# --data        built-in datasets to download and check, comma-separated, or none (default: fmnist)
# --requirements  a pip requirements file instead of this project's own (pyproject.toml, with its test extra)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '7,14p' "$0" >&2; exit 2; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
bundle=$(realpath -m "$1"); shift
python=$(python3 -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
platform=manylinux_2_28_x86_64
datasets=fmnist
requirements=""
while [ $# -gt 0 ]; do
    case $1 in
        --python) python=$2 ;;
        --platform) platform=$2 ;;
        --data) datasets=$2 ;;
        --requirements) requirements=$(realpath "$2") ;;
        *) usage ;;
    esac
    shift 2 || usage
done

mkdir -p "$bundle/wheels" "$bundle/data"
if [ -z "$requirements" ]; then  # the project's packages, its test extra and its build backend
    requirements="$bundle/requirements.txt"
    python3 - > "$requirements" <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join([*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["test"],
                 *project["build-system"]["requires"], "pip"]))
PY
fi
platforms=(--platform "$platform")
case $platform in  # a manylinux_2_28 machine also takes the older manylinux wheels
    manylinux_2_28_x86_64) for p in manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do platforms+=(--platform "$p"); done ;;
esac
echo "Wheels for Python $python on $platform -> $bundle/wheels"
python3 -m pip download -q --dest "$bundle/wheels" --only-binary=:all: --python-version "$python" --implementation cp \
    "${platforms[@]}" -r "$requirements"

if [ "$datasets" != none ]; then
    [ -x .venv/bin/python ] || { echo "Datasets are fetched with this project's loaders: run bash scripts/install.sh first." >&2; exit 2; }
    if [[ ",$datasets," == *,fmnist,* ]] && [ -d /usr/share/datasets/fashion-mnist ]; then
        cp /usr/share/datasets/fashion-mnist/*.gz "$bundle/data/"  # Debian's copy: no download needed
    fi
    echo "Datasets $datasets -> $bundle/data"
    .venv/bin/python - "$bundle/data" "$datasets" <<'PY'
import sys

from tuner.data.datasets import load_dataset

for name in sys.argv[2].split(","):  # downloaded through torchvision, then read back whole as a run reads it
    print(f"  {name}: {len(load_dataset(name, sys.argv[1], download=True).y)} samples")
PY
fi

cat > "$bundle/README.txt" <<EOF
A bundle for pfl-tuner on a machine without internet (Python $python, $platform), made $(date -u +%F).
Copy this folder and the project's repository over; then, in the repository:

    PIP_NO_INDEX=1 PIP_FIND_LINKS=$bundle/wheels bash scripts/setup.sh
    mkdir -p ~/.cache/pfl-tuner && cp -r $bundle/data ~/.cache/pfl-tuner/   # where runs look for datasets

(if the bundle sits elsewhere on that machine, write its path instead of $bundle).
EOF
du -sh "$bundle/wheels" "$bundle/data"
echo "Done: $bundle (see $bundle/README.txt)."
