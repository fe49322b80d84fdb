#!/usr/bin/env bash
# What the closing notes' GPU figures come from: run on a GPU machine with DALI installed, from the
# repo root. DATA is an ImageNet-like folder; if it does not exist, 10,000 real-photo JPEGs are
# written there first (gputransforms.sampledata):
#   DATA=/tmp/ds OUT=/some/dir bash benchmarks/gpu_session.sh tests|bench [pytest args]
set -uo pipefail
: "${DATA:=/tmp/gputransforms-bench-data}" "${OUT:=bench-out}"
mkdir -p "$OUT"
[ -d "$DATA" ] || python3 -c "import os, sys; from benchmarks.common import make_data; make_data(sys.argv[1], 10000)" "$DATA"
python3 -c "import torch, torchvision, nvidia.dali as d; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'dali', d.__version__, torch.cuda.get_device_name())"
case "${1:-tests}" in
tests)
  python3 -m pytest -q -s -p no:cacheprovider "${@:2}" > "$OUT/pytest.log" 2>&1
  grep -E "^parity\[gpu\]|^odd files \[gpu\]|^soak \[gpu\]|passed|failed" "$OUT/pytest.log" | tail -40
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20 ;;
bench)
  python3 -m benchmarks.loader "$DATA" --batch-size 256 --threads 8 --out "$OUT" --chains ${CHAINS:-train,eval,ta_wide,simclr} \
      --pipelines torchvision,dali-handwritten,dali-experimental-tv,gputransforms,gputransforms-fancy-ups \
      ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  grep -v -i "warning" "$OUT/bench.log" | tail -24 ;;
esac
