#!/usr/bin/env bash
# The acceptance on a lent GPU, in the minutes a lease gives (15 in all, start-up included;
# 10 a command): the checks of scripts/gpu_acceptance.py in the order of how likely each is to
# find a fault, in groups each under its own timeout, every row written to JSON as it finishes
# (a group cut at its timeout keeps what it measured).
#
#   bash scripts/device/wheels.sh                  # here, once: the wheels the device lacks, in .whl/
#   # on the device (the device tool's run, carry: [".whl"], timeout_s 600):
#   bash scripts/device/acceptance.sh 1            # memory and NVML, data wait and transfer, the search
#   bash scripts/device/acceptance.sh 2            # FLOPs and MFU, failures, engines
#   bash scripts/device/acceptance.sh 3            # ranks and the GPU-era levers (a later lease)
#   bash scripts/device/acceptance.sh 4            # a node of two GPUs or more: DDP, ZeRO-2, FSDP2 over
#                                                  # NCCL, comm_share vs the trace, the job's GPUs' energy
#
# Part 1 is planned for 540 s of the GPU with the install, part 2 for the rest of a first
# lease, part 3 for a second one. Rows go to $OUT (the device tool's folder) or ./acceptance-out.
# Without CUDA it says so in one line and exits 2, before installing anything.
set -uo pipefail
cd "$(dirname "$0")/../.."
part=${1:-1}
python3 - <<'EOF' || exit 2
import sys
try:
    import torch
except ImportError:
    sys.exit("acceptance: PyTorch is not installed here; run it on a lent GPU (scripts/device/acceptance.sh)")
if not torch.cuda.is_available():
    sys.exit(f"acceptance: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False); "
             "run it on a lent GPU: bash scripts/device/acceptance.sh 1")
EOF
out=${OUT:-$PWD/acceptance-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "acceptance: the carried wheels did not install (see above)"; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())))"

# group name, timeout (s), the checks (gpu_acceptance's names; what they need runs with them)
case "$part" in
  1) groups=("nvml 150 memory,utilization,energy" "wait 180 step_time,data_wait,transfer" "search 150 search") ;;
  2) groups=("compute 90 flops,mfu" "failures 150 ooms,poisoned,resume" "engines 120 precisions,offload") ;;
  3) groups=("ranks 200 two_ranks,probe_torchrun,script_gpus,layout,prewarmed"
             "levers 300 compile,float8,attention,graphs,expandable") ;;
  4) groups=("nodes 240 nccl_engines,nccl_comm,nccl_energy") ;;
  *) echo "acceptance: part must be 1, 2, 3 or 4, got '$part'"; exit 2 ;;
esac
if [ "$part" = 4 ]; then
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  if [ "$gpus" -lt 2 ]; then
    echo "acceptance: part 4 needs two GPUs (one rank each, over NCCL), and this machine has $gpus; nothing run"
    exit 0
  fi
fi
status=0
for group in "${groups[@]}"; do
  read -r name limit checks <<<"$group"
  echo "== part $part, $name (at most ${limit}s): $checks"
  timeout --kill-after=10 "$limit" python3 scripts/gpu_acceptance.py --only "$checks" --out "$out/part${part}-${name}.json"
  rc=$?
  [ "$rc" -eq 124 ] && echo "== $name: cut at its ${limit}s; its finished rows are in $out/part${part}-${name}.json"
  [ "$rc" -ne 0 ] && status=1
done
exit $status
