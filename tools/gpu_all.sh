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
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && tar xJf .device/tl_site.tar.xz -C /tmp/site \
  && ln -sf libz3.so.4.15 /tmp/site/z3/lib/libz3.so || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
COMMIT=${1:-unknown}
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.csv" 2>&1
crc=skipped; brc=skipped
if [ "${PART:-all}" != bench ]; then
timeout -s INT -k 15 "${CONFORM_S:-540}" python -m tools.cli conform --device cuda --tier "${TIER:-full}" \
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
echo "conform rc=$crc bench rc=$brc"
