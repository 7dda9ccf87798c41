#!/usr/bin/env bash
# One device call for the GPU tier and the benchmark (see README, "GPU runs").
#   bash tools/gpu_all.sh <commit>      (device tool: carry [".device"], $OUT set)
# Unpacks TileLang (../shared/device/README.md), runs the full conformance tier
# on CUDA and the benchmark suite, each under its own time cap, and leaves
# conform.json / bench.json / BENCHMARKS.md / bench.png and logs under $OUT.
# BACKEND_ARGS="--backend reference --backend triton --backend triton-tma --backend tilelang
# --backend tilelang-split" adds optional backends to the conformance run. PART=conform or PART=bench runs one
# half only: the full tier with all four backends (1084 cases at 677ea40: 469 s at
# -n 8 on a fresh H200 machine, TileLang compiles included) and the bench (78 s right
# after it on the same machine, kernels cached) do not fit one 10-minute call together.
# The tier needs two calls too since session 6; session 15's five-backend tier (2525 cases,
# d4faf39, WORKERS=14, one H200: 337 s + 295 s) split it as
# ONLY="headdim,dtype,basic,gqa,lengths,window,chunk,long,empty_rows,errors,empty_dims,scale,kv_start"
# then ONLY="layout,gqa_pack,tile_chunk,flags,decode,nan_v_seen,nan_seen,nan_slots".
# Before the tier, tools/tl_lower.py lowers the TileLang kernels of those categories on
# the host's cores (PRELOWER=0 skips it; PRELOWER_S caps it, 240 s); a kernel that does
# not lower stops the call there (tl_lower.log names it and its cases).
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && tar xJf .device/tl_site.tar.xz -C /tmp/site \
  && ln -sf libz3.so.4.15 /tmp/site/z3/lib/libz3.so || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
COMMIT=${1:-unknown}
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.csv" 2>&1
crc=skipped; brc=skipped; lrc=skipped
if [ "${PART:-all}" != bench ] && [ "${PRELOWER:-1}" != 0 ]; then
# Pre-flight (left CI in session 16): every TileLang kernel the tier's categories build
# lowers for sm_90a (tools/tl_lower.py, no GPU), else the tier does not start.
timeout -s INT -k 15 "${PRELOWER_S:-240}" python -m tools.tl_lower --tier "${TIER:-full}" \
  --fold-dtypes -j "$(nproc)" ${ONLY:+--only "$ONLY"} > "$OUT/tl_lower.log" 2>&1
lrc=$?
grep -E '^(FAIL|  )|lower, ' "$OUT/tl_lower.log" | head -30
fi
if [ "${PART:-all}" != bench ] && { [ "$lrc" = skipped ] || [ "$lrc" = 0 ]; }; then
# CONFORM_S caps the call up to the end of the tier (the unpack and pre-flight included)
timeout -s INT -k 15 "$(( ${CONFORM_S:-540} - SECONDS ))" python -m tools.cli conform --device cuda --tier "${TIER:-full}" \
  -n "${WORKERS:-8}" --seed 0 ${ONLY:+--only "$ONLY"} ${BACKEND_ARGS:-} --json "$OUT/conform.json" \
  > "$OUT/conform.log" 2>&1
crc=$?
[ -f "$OUT/conform.json" ] && rm -f "$OUT"/*.partial.jsonl
sed -n '/hils-swa conformance =/,$p' "$OUT/conform.log" | head -60
fi
if [ "${PART:-all}" != conform ]; then
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
timeout -s INT -k 15 "${BENCH_S:-240}" python -m tools.cli bench --json "$OUT/bench.json" \
  --md "$OUT/BENCHMARKS.md" --png "$OUT/bench.png" --commit "$COMMIT" --budget-s "${BENCH_BUDGET:-190}" \
  > "$OUT/bench.log" 2>&1
brc=$?
tail -45 "$OUT/bench.log"
fi
echo "tl_lower rc=$lrc conform rc=$crc bench rc=$brc"
