#!/usr/bin/env bash
# Closed loop on one NVIDIA H200: sim.measure, then scripted sim.confirm on the bundled
# traces, for random-weight qwen3-1.7b and qwen3-8b shapes in bf16. Everything lands under $OUT
# (8 files: versions.txt, log.txt, two profiles, two confirm.json, a v2 profile over context length, and the
# long-context closed loop as one archive). At most about 9.5 minutes of device time; every step has its own
# timeout. How to run: device/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/draftlab-h200}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
# The machine's image has torch, transformers, numpy, yaml, tiktoken and tqdm; simpy travels as a wheel in .whl/.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 - <<'PY' | tee "$OUT/versions.txt"
import platform, torch, transformers, simpy
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__,
      "simpy", simpy.__version__)
print(torch.cuda.get_device_name(), "CUDA", torch.version.cuda)
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee -a "$OUT/versions.txt"

# Traces cut at 160 tokens (email has 125) keep both models inside the budget: about 765 tokens x 3 arms
# x 2 repetitions per model. Each step gets at most its own cap and never more than the time left of 470 s.
deadline=$((SECONDS + 560))
left() {  # seconds for the next step: its cap, or what is left (at least 1: `timeout 0` would mean no limit)
  local t=$((deadline - SECONDS))
  if [ "$t" -lt 1 ]; then echo 1; elif [ "$t" -lt "$1" ]; then echo "$t"; else echo "$1"; fi
}
for arch in qwen3-1.7b qwen3-8b; do
  profile="$OUT/h200-$arch-bf16-random.yaml"
  timeout "$(left 100)" python3 -m sim.measure --arch "$arch" --device cuda --dtype bfloat16 \
    --rounds 15 --warmup 3 --prompt-tokens 300 --out "$profile" || echo "measure $arch exited $?"
  timeout "$(left 200)" python3 -m sim.confirm traces/*.jsonl --scripted --arch "$arch" --device cuda \
    --dtype bfloat16 --profile "$profile" --policies graded,gated --reps 2 --max-tokens 160 --out "$OUT/confirm-$arch" \
    || echo "confirm $arch exited $?"
done
# Costs that follow the context: a v2 profile of the 8B shape on a context grid. confirm.md repeats what
# confirm.json holds and is already in log.txt (confirm prints it), so it is dropped to stay within 8 files.
rm -f "$OUT"/confirm-*/confirm.md
timeout "$(left 150)" python3 -m sim.measure --arch qwen3-8b --device cuda --dtype bfloat16 --rounds 9 --warmup 2 \
  --contexts 512,2048,8192 --out "$OUT/h200-qwen3-8b-bf16-v2.yaml" || echo "measure v2 exited $?"
# The long-context closed loop (2k- and 4k-token prompts) on the 1.7B shape: v1 vs v2 profile against measured
# speedups. Its files travel as one archive, the eighth file.
timeout "$(left 150)" python3 benchmarks/long_context_cpu.py --arch qwen3-1.7b --device cuda --dtype bfloat16 \
  --reps 3 --rounds 9 --out /tmp/draftlab-long/long_context_h200 || echo "long context exited $?"
tar czf "$OUT/long_context_h200.tar.gz" -C /tmp draftlab-long 2>/dev/null || echo "no long-context results"
