#!/usr/bin/env bash
# The GPU kernels under NVIDIA compute-sanitizer (see README, "GPU runs").
#   bash tools/gpu_sanitize.sh          (device tool: carry [".device"], $OUT set)
# Runs the conformance suite's CUDA cases (quick tier, every category but `long`,
# whose 128K caches would take the sanitizer minutes per case; `long4m`'s 4M-key cache is
# in: its kernels read only the window, 1-2 GB into the cache) once per backend
# under each tool, in parallel processes without xdist, and leaves one log per
# (tool, backend) and a summary under $OUT (for a run that fails, its first sanitizer lines and
# its failures copied into the summary):
#   memcheck   out-of-bounds and misaligned global / shared accesses, every backend
#   racecheck  shared-memory hazards, TileLang (TileLang places its own barriers,
#              tools/tl_lower.py) on three small categories
#   synccheck  barrier misuse (a __syncthreads in divergent code), same cases
#   initcheck  refused: it gives no verdict on this suite. Checking every kernel (d4faf39) it
#              reported over a million reads in the suite's own yardstick,
#              reference.same_dtype (the bf16 result of a batched matmul copied to fp32),
#              and two of its four runs ran out of time; checking the backends' kernels only
#              (--kernel-name, 152c129) it reports reads of memory that the unchecked
#              kernels wrote (a one-byte result of torch's, read back by .item()) from the
#              first case on, and neither run got past its second check in 240 s: writes by
#              unchecked kernels are not tracked (BENCHMARKS.md, sessions 15 and 16;
#              conformance/results/h200-initcheck-kernel-filter-152c129.txt).
# Sanitized kernels run 10-100x slower and every module is instrumented when it loads:
# run this on a machine whose Triton and TileLang caches are warm (right after
# tools/gpu_all.sh in the same lease), or give it time: with a TileLang backend the script
# first builds the runs' TileLang kernels in parallel (below). TOOLS, BACKENDS, SAN_ONLY
# (categories for every tool), SAN_S (seconds per run), PREBUILD_S (seconds for the build;
# PREBUILD=0 skips it) override the defaults; TL_UNPACK=0 skips the
# TileLang unpack (tools/tl_site.sh, as in gpu_all.sh). Exit status 1 when any tool reports
# an error or a run does not end with every check passing or deviating as documented
# (conform's exit status 0).
set -u
export PYTHONUNBUFFERED=1
TOOLS=${TOOLS:-"memcheck racecheck synccheck"}
for tool in $TOOLS; do
  case "$tool" in
    memcheck|racecheck|synccheck) ;;
    initcheck) echo "initcheck gives no verdict on this suite (see the header of $0)" >&2; exit 2 ;;
    *) echo "unknown tool '$tool': memcheck, racecheck or synccheck" >&2; exit 2 ;;
  esac
done
if [ "${TL_UNPACK:-1}" != 0 ] && [ -f .device/tl_site.tar.xz ]; then bash tools/tl_site.sh || exit 1; fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
SAN=${SANITIZER:-compute-sanitizer}
command -v "$SAN" > /dev/null || SAN=/usr/local/cuda/bin/compute-sanitizer
ALL_CATS="basic,dtype,headdim,gqa,lengths,window,chunk,tile_chunk,kv_start,flags,scale,empty_rows,layout,nan_slots,nan_seen,inf_seen,nan_v_seen,errors,empty_dims,decode,gqa_pack,chunk_view,long4m,reach"
# racecheck / synccheck: small cases only. chunk_view (about 100 heads x 2048 queries a case)
# is not among them; TileLang's view kernels were raced on the small cases of
# tests/test_tilelang_view_gpu.py instead (session 25: 0 hazards, 0 errors).
SMALL_CATS="flags,decode,gqa_pack"
BACKENDS=${BACKENDS:-"triton triton-tma tilelang tilelang-split"}
OUTDIR=${OUT:-/tmp/sanitize}
mkdir -p "$OUTDIR"
rm -f "$OUTDIR"/*.rc  # the summary reads every .rc file: none from an earlier run
"$SAN" --version | tail -1 > "$OUTDIR/sanitizer-version.txt" 2>&1

# Build the TileLang kernels of the runs first, in parallel, into TileLang's disk cache
# (tools/tl_lower.py --build): the sanitized runs take one case at a time, and a kernel built
# inside one costs 8-53 s against 0.4-1.4 s for a check whose kernel is built (session 35).
# Not a gate: a kernel that fails to build here fails its case in the run too, and one left
# unbuilt when PREBUILD_S (300) runs out is built by the run. PREBUILD=0 skips it.
prc=skipped; pline=""
case " $BACKENDS " in *" tilelang"*)
  if [ "${PREBUILD:-1}" != 0 ]; then
    case " $TOOLS " in *" memcheck "*) pcats=${SAN_ONLY:-$ALL_CATS} ;; *) pcats=${SAN_ONLY:-$SMALL_CATS} ;; esac
    timeout -s INT -k 15 "${PREBUILD_S:-300}" python -m tools.tl_lower --tier quick --build \
      --only "$pcats" > "$OUTDIR/tl_build.log" 2>&1
    prc=$?
    pline=$(tail -1 "$OUTDIR/tl_build.log" | cut -c1-200)
    echo "prebuild rc=$prc: $pline"
  fi ;;
esac

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
      racecheck|synccheck) case "$be" in tilelang*) cats=${SAN_ONLY:-$SMALL_CATS} ;; *) continue ;; esac ;;
      *) cats=${SAN_ONLY:-$ALL_CATS} ;;
    esac
    run_one "$tool" "$be" "$cats" &
  done
done
wait

status=0
shopt -s nullglob
rcs=("$OUTDIR"/*.rc)
[ ${#rcs[@]} -gt 0 ] || { echo "no run: TOOLS=$TOOLS BACKENDS=$BACKENDS"; exit 1; }
printf '%-10s %-15s %4s %s\n' tool backend rc "sanitizer summary / conformance" | tee "$OUTDIR/summary.txt"
for rcf in "${rcs[@]}"; do
  name=$(basename "$rcf" .rc); tool=${name%%-*}; be=${name#*-}  # tool names hold no '-'
  rc=$(cat "$rcf"); log="$OUTDIR/$name.log"
  if [ "$tool" = racecheck ]; then
    clean='RACECHECK SUMMARY: 0 hazards'; summ=$(grep -h 'RACECHECK SUMMARY' "$log" | tail -1)
  else
    clean='ERROR SUMMARY: 0 errors$'; summ=$(grep -hE 'ERROR SUMMARY: [0-9]+ errors?$' "$log" | tail -1)
  fi
  conf=$(grep -h 'checks' "$log" | tail -1)
  printf '%-10s %-15s %4s %s | %s\n' "$tool" "$be" "$rc" "${summ:-no summary}" "${conf:-}" \
    | tee -a "$OUTDIR/summary.txt"
  # rc 0: every check passed or deviated as documented and the tool found nothing; a failing
  # check, a crash, a timeout (124) or sanitizer errors (99) all count. What went wrong goes
  # into summary.txt itself: the device tool brings back a few files only (session 33: a
  # run's 14 files came back as 8, and the logs of two failing runs stayed behind)
  if [ "$rc" != 0 ] || ! grep -q "$clean" "$log"; then
    status=1
    { grep -m 40 -E '^========= ' "$log"; grep -A 12 -E '^(failures|errors outside the checks) \(' "$log"; } \
      | cut -c1-300 | sed 's/^/    /' >> "$OUTDIR/summary.txt"
  fi
done
{ echo "TileLang prebuild (tools/tl_lower.py --build) rc=$prc${pline:+: $pline}"
  [ "$prc" = skipped ] || [ "$prc" = 0 ] || grep -m 20 -E '^(FAIL|  )' "$OUTDIR/tl_build.log" \
    | cut -c1-300 | sed 's/^/    /'; } | tee -a "$OUTDIR/summary.txt"
exit $status
