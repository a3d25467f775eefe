#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one run, for a lent GPU session (see the device tool's README), the most
# valuable first, so a session cut short still brings them back:
#   1. the caching allocator's snapshots beside memlab's model of it (scripts/record_allocator_snapshot.py: needs
#   only torch and memlab), 2. the largest batch the capped allocator runs beside memlab's formula ends and traced
#   search (scripts/record_max_batch.py), 3. the GPU-marked tests, 4. the CUDA ledger recording (data/recorded/cuda_ledger.*) and
#   chapters 01/03/04's GPU-only results (data/recorded/0N_*_gpu.*), 5. the chapters at full scale, 6. the GPU-Util
#   and NVML memory-ledger demonstrations (scripts/record_utilisation.py).
# tests/scripts/test_gpu_session.py dry-runs the plumbing on a CPU (the order, each script's --dry-run or refusal).
# Results go to $OUT (default ./gpu-out); commit what comes back under data/recorded/ with its provenance.
# The device image has torch; memlab's other needs (pandas, matplotlib, nvidia-ml-py, psutil, tqdm, papermill,
# nbconvert, jupytext, ipykernel, pytest) travel as wheels when missing (device README, "Notes").
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the wheels the image lacks (scripts/fetch_device_wheels.sh, carried as .whl): installed beside, not over, the image
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
python3 scripts/record_allocator_snapshot.py --out "$OUT" 2>&1 | tee "$OUT/allocator.txt"
python3 scripts/record_max_batch.py --out "$OUT" 2>&1 | tee "$OUT/max-batch.txt"
python3 -m pytest -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
python3 scripts/record_cuda_ledger.py --out "$OUT" 2>&1 | tee "$OUT/record.txt"
python3 scripts/record_chapters_gpu.py --out "$OUT" 2>&1 | tee "$OUT/record-chapters.txt"
python3 -m memlab.course.report --scale full --force --no-progress --out "$OUT/report" 2>&1 | tail -n 40 | tee "$OUT/report.txt"
python3 scripts/record_utilisation.py --out "$OUT/utilisation" 2>&1 | tee "$OUT/utilisation.txt"
