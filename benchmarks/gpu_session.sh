#!/usr/bin/env bash
# What the closing notes' GPU figures come from: run on the GPU machine after staging DALI
# (../shared/device/README.md), from the repo root, with DATA an ImageNet-like folder:
#   DATA=/tmp/ds OUT=/some/dir bash benchmarks/gpu_session.sh [pytest args...]
set -uo pipefail
: "${DATA:?set DATA to an ImageFolder root}" "${OUT:=bench-out}"
mkdir -p "$OUT"
python3 -c "import torch, torchvision, nvidia.dali as d; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'dali', d.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -s -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log" | grep -E "parity\[|passed|failed|Error|error" | tail -60
python3 -m benchmarks.loader "$DATA" --batch-size 256 --threads 8 --out "$OUT" \
    --pipelines torchvision,dali-handwritten,dali-experimental-tv,gputransforms,gputransforms-fancy-ups ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -25
