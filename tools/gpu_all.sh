#!/usr/bin/env bash
# One device call for the GPU tier and the benchmark (see README, "GPU runs").
#   bash tools/gpu_all.sh <commit>      (device tool: carry [".device"], $OUT set)
# Unpacks TileLang (../shared/device/README.md), runs the full conformance tier
# on CUDA and the benchmark suite, each under its own time cap, and leaves
# conform.json / bench.json / BENCHMARKS.md / bench.png and logs under $OUT (with SHARD=n the
# tier's files are conform-shardn.json / .log and tl_lower-shardn.log, so that several shards
# run in one call keep their results).
# BACKEND_ARGS="--backend reference --backend triton --backend triton-tma --backend tilelang
# --backend tilelang-split" adds optional backends to the conformance run. PART=conform or PART=bench runs one
# half only: the full tier with all four backends (1084 cases at 677ea40: 469 s at
# -n 8 on a fresh H200 machine, TileLang compiles included) and the bench (78 s right
# after it on the same machine, kernels cached) do not fit one 10-minute call together.
# The tier needs two calls too since session 6 (session 15's five-backend tier, 2525 cases,
# d4faf39, WORKERS=14, one H200: 337 s + 295 s), three since session 28: SHARD below.
# Session 19 (reference, triton, triton-tma; TL_UNPACK=0 for the first half; -n 14): the first
# half 77 s, the second 195 s for 95% of its checks (CONFORM_S=200 was short: give it 260).
# Before the tier, tools/tl_lower.py lowers the TileLang kernels of those categories on
# the host's cores (tl_lower's default: at most 16 processes), when a TileLang backend is in the run
# (BACKEND_ARGS empty: the defaults, TileLang among them); a kernel that does not lower,
# or a pre-flight that crashes or outruns PRELOWER_S (240 s), keeps the tier from
# starting (tl_lower.log, tl_lower-shardN.log: the kernel and its cases); the bench still runs. PRELOWER=0
# skips it. PRELOWER=build builds the kernels instead (tools/tl_lower.py --build: nvcc included,
# into TileLang's disk cache, each dtype its own kernel), so the workers find them built: a
# kernel that does not build keeps the tier from starting as above, but running out of
# PRELOWER_S does not (the workers build what is left). Session 36 for SHARD=3: `long4m`'s
# TileLang checks took 28-58 s each when their worker built the kernel, and a heavy case holds
# one of the GPU's memory slots while it runs (conformance.runner.heavy). CONFORM_S (whole
# seconds, 540) caps the call up to the end of the tier, the unpack and the pre-flight
# included; under 30 s left, the tier does not start. WHERE="EXPR" passes conform's --where (cases
# by their fields, e.g. "Lq > 64 and max(Dqk, Dv) <= 128 and dtype != 'fp32'") to the tier and the
# pre-flight, beside ONLY or a SHARD.
# TL_UNPACK=0 skips the TileLang unpack (tools/tl_site.sh; the CPU test of this script).
set -u
export PYTHONUNBUFFERED=1
# The full tier's CUDA categories in three calls (SHARD=1, 2 or 3 sets ONLY; each category
# in exactly one shard, tests/test_tools_scripts.py): session 28 at e41b767 with the default
# backends, -n 14: shard 1 had not finished at its 330 s cap (717 of 903 cases), shard 2
# 286 s; chunk_view (288 cases of about 100 heads x 2048 queries) alone, as session 25 ran it. Session 27's split by hand had left it out.
# long4m (session 31, 32 cases of a 4M-key cache) and reach (session 33, 25 calls for branches
# no other category takes) join chunk_view.
SHARD_1="headdim,dtype,basic,gqa,lengths,window,chunk,long,empty_rows,errors,empty_dims,scale,kv_start"
SHARD_2="layout,gqa_pack,tile_chunk,flags,decode,nan_v_seen,nan_seen,nan_slots,inf_seen"
SHARD_3="chunk_view,long4m,reach"
case "${SHARD:-}" in
  "") ;;
  1|2|3) [ -n "${ONLY:-}" ] && { echo "SHARD and ONLY together: give one" >&2; exit 2; }
         eval "ONLY=\$SHARD_${SHARD}" ;;
  *) echo "SHARD=${SHARD}: 1, 2 or 3" >&2; exit 2 ;;
esac
case "${CONFORM_S:-540}" in *[!0-9]*) echo "CONFORM_S=${CONFORM_S}: whole seconds" >&2; exit 2 ;; esac
case "${PRELOWER:-1}" in
  0|1) mode=(--fold-dtypes); did="lower" ;;
  build) mode=(--build); did="build" ;;
  *) echo "PRELOWER=${PRELOWER}: 0, 1 or build" >&2; exit 2 ;;
esac
if [ "${TL_UNPACK:-1}" != 0 ]; then bash tools/tl_site.sh || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
COMMIT=${1:-unknown}
tag=${SHARD:+-shard$SHARD}
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.csv" 2>&1
crc=skipped; brc=skipped; lrc=skipped
case " ${BACKEND_ARGS:-tilelang} " in *tilelang*) tl_run=1 ;; *) tl_run=0 ;; esac
if [ "${PART:-all}" != bench ] && [ "${PRELOWER:-1}" != 0 ] && [ "$tl_run" = 1 ]; then
  timeout -s INT -k 15 "${PRELOWER_S:-240}" python -m tools.tl_lower --tier "${TIER:-full}" \
    "${mode[@]}" ${ONLY:+--only "$ONLY"} ${WHERE:+"--where=$WHERE"} > "$OUT/tl_lower$tag.log" 2>&1
  lrc=$?
  case "$lrc" in
    0) tail -1 "$OUT/tl_lower$tag.log" ;;
    1) grep -E '^(FAIL|  )|(lower|built), ' "$OUT/tl_lower$tag.log" | head -30
       echo "pre-flight: kernels that do not $did (above); the tier does not start" ;;
    124|137) tail -3 "$OUT/tl_lower$tag.log"
       if [ "$did" = build ]; then
         echo "pre-flight: out of time (PRELOWER_S=${PRELOWER_S:-240}); the tier builds the rest"
         lrc="$lrc-time"
       else
         echo "pre-flight: out of time (PRELOWER_S=${PRELOWER_S:-240}); the tier does not start"
       fi ;;
    *) tail -15 "$OUT/tl_lower$tag.log"
       echo "pre-flight: crashed (rc $lrc, above); the tier does not start" ;;
  esac
fi
if [ "${PART:-all}" != bench ] && { [ "$lrc" = skipped ] || [ "$lrc" = 0 ] || [ "${lrc%-time}" != "$lrc" ]; }; then
  left=$(( ${CONFORM_S:-540} - SECONDS ))
  if [ "$left" -lt 30 ]; then
    crc=no-time
    echo "tier not started: ${left} s of CONFORM_S=${CONFORM_S:-540} left"
  else
    timeout -s INT -k 15 "$left" python -m tools.cli conform --device cuda --tier "${TIER:-full}" \
      -n "${WORKERS:-8}" --seed 0 ${ONLY:+--only "$ONLY"} ${WHERE:+"--where=$WHERE"} ${BACKEND_ARGS:-} --json "$OUT/conform$tag.json" ${1:+--commit "$1"} \
      > "$OUT/conform$tag.log" 2>&1
    crc=$?
    [ -f "$OUT/conform$tag.json" ] && rm -f "$OUT/conform$tag.json.partial.jsonl"  # its own only
    sed -n '/hils-swa conformance =/,$p' "$OUT/conform$tag.log" | head -60
  fi
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
