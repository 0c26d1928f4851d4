#!/usr/bin/env bash
# The wheels a lent GPU machine (no network; its image has CUDA PyTorch, triton,
# nvidia-ml-py, accelerate, transformers, lightning, rich, matplotlib, PyYAML, psutil) lacks
# to run the tuner and scripts/gpu_acceptance.py: Optuna and DeepSpeed with what they need,
# torchao and Liger-Kernel (the float8 and fused-loss levers),
# for its Python (3.12, x86_64). Run here, in the repository's root, where pip can reach the
# index; the wheels land in .whl/ (ignored by git, carried to the device: `carry: [".whl"]`).
#
#   bash scripts/device/wheels.sh
#   # on the device:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#     export PYTHONPATH=/tmp/site:$PWD && python3 scripts/gpu_acceptance.py --group 1 --out $OUT/g1.json
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for n in 17 27 28 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  optuna==5.1.0 alembic==1.17.2 colorlog==6.10.1 sqlalchemy==2.0.44 greenlet==3.2.4 Mako==1.3.10 \
  hjson==3.1.0 pydantic==2.12.4 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 \
  py-cpuinfo==9.0.0 ninja==1.13.0 torchao==0.18.0 liger-kernel==0.8.5
# DeepSpeed publishes a source release only: its wheel is built here, pure Python (its ops are
# compiled where they run), against whatever torch this environment has.
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
ls .whl
