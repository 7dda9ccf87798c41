#!/usr/bin/env bash
# The GPU kernels under NVIDIA compute-sanitizer (see README, "GPU runs").
#   bash tools/gpu_sanitize.sh          (device tool: carry [".device"], $OUT set)
# Runs the conformance suite's CUDA cases (quick tier, every category but `long`,
# whose 128K caches would take the sanitizer minutes per case) once per backend
# under each tool, in parallel processes without xdist, and leaves one log per
# (tool, backend) and a summary under $OUT:
#   memcheck   out-of-bounds and misaligned global / shared accesses, every backend
#   racecheck  shared-memory hazards, TileLang (TileLang places its own barriers,
#              tools/tl_lower.py) on three small categories
#   synccheck  barrier misuse (a __syncthreads in divergent code), same cases
#   initcheck  (not in the default TOOLS) reads of device memory no one wrote. At d4faf39
#              it reported over a million reads in the suite's own yardstick,
#              reference.same_dtype (the bf16 copy of a batched-matmul result, the first
#              20 printed all there; cause not established, and whether any report
#              concerned our kernels is unknown), and two of its four runs ran out of
#              time: not usable on the suite as it stands (BENCHMARKS.md, session 15).
# Sanitized kernels run 10-100x slower and every module is instrumented when it loads:
# run this on a machine whose Triton and TileLang caches are warm (right after
# tools/gpu_all.sh in the same lease), or give it time. TOOLS, BACKENDS, ONLY, SAN_S
# override the defaults. Exit status 1 when any tool reports an error or a run fails.
set -u
export PYTHONUNBUFFERED=1
if [ -f .device/tl_site.tar.xz ] && [ ! -d /tmp/site/tilelang ]; then
  mkdir -p /tmp/site && tar xJf .device/tl_site.tar.xz -C /tmp/site \
    && ln -sf libz3.so.4.15 /tmp/site/z3/lib/libz3.so || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
SAN=${SANITIZER:-compute-sanitizer}
command -v "$SAN" > /dev/null || SAN=/usr/local/cuda/bin/compute-sanitizer
ALL_CATS="basic,dtype,headdim,gqa,lengths,window,chunk,tile_chunk,kv_start,flags,scale,empty_rows,layout,nan_slots,nan_seen,nan_v_seen,errors,empty_dims,decode,gqa_pack"
SMALL_CATS="flags,decode,gqa_pack"
BACKENDS=${BACKENDS:-"triton triton-tma tilelang tilelang-split"}
TOOLS=${TOOLS:-"memcheck racecheck synccheck"}
OUTDIR=${OUT:-/tmp/sanitize}
mkdir -p "$OUTDIR"
"$SAN" --version | tail -1 > "$OUTDIR/sanitizer-version.txt" 2>&1

run_one() {  # tool backend categories
  local tool=$1 be=$2 cats=$3 log="$OUTDIR/$1-$2.log"
  local extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check no)
  [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
  timeout -s INT -k 15 "${SAN_S:-500}" "$SAN" --tool "$tool" "${extra[@]}" --report-api-errors no \
    --error-exitcode 99 --print-limit 20 \
    python -m tools.cli conform --device cuda --tier quick -n 0 --seed 0 --only "$cats" \
      --backend "$be" --json "$OUTDIR/$tool-$be.json" > "$log" 2>&1
  echo "$?" > "$OUTDIR/$tool-$be.rc"
}

for tool in $TOOLS; do
  for be in $BACKENDS; do
    case "$tool" in
      racecheck|synccheck) case "$be" in tilelang*) cats=${ONLY:-$SMALL_CATS} ;; *) continue ;; esac ;;
      *) cats=${ONLY:-$ALL_CATS} ;;
    esac
    run_one "$tool" "$be" "$cats" &
  done
done
wait

status=0
printf '%-10s %-15s %4s %s\n' tool backend rc "sanitizer summary / conformance" | tee "$OUTDIR/summary.txt"
for rcf in "$OUTDIR"/*.rc; do
  name=$(basename "$rcf" .rc); tool=${name%%-*}; be=${name#*-}
  rc=$(cat "$rcf"); log="$OUTDIR/$name.log"
  summ=$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/=* *//')
  conf=$(grep -h 'checks' "$log" | tail -1)
  printf '%-10s %-15s %4s %s | %s\n' "$tool" "$be" "$rc" "${summ:-no summary}" "${conf:-}" \
    | tee -a "$OUTDIR/summary.txt"
  # conform's own exit status 1 (a failing check) is the suite's business, not the sanitizer's
  case "$rc" in 0|1) ;; *) status=1 ;; esac
  grep -q 'ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards' "$log" || status=1
done
exit $status
