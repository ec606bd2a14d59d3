#!/usr/bin/env bash
# Compiles kvtier's services/ with clang's thread-safety analysis, its
# findings errors (-Wthread-safety -Werror=thread-safety): a member
# ABSL_GUARDED_BY a mutex touched without it, a *Locked function called
# unlocked, fail the check. Compile only (object files in build-clang/), no
# CUDA: gcc builds, links and tests everything; this is the analysis gcc
# does not have. Clang 14 cannot compile every file against gcc 12's
# standard library (its <ranges>): such a file fails the check only when
# it holds a mutex or an annotation the analysis would have looked at.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build-clang -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DKVTIER_CUDA=OFF -DKVTIER_BUILD_BENCHMARKS=ON -DCMAKE_OPTIMIZE_DEPENDENCIES=ON \
  "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety"
# Every object file of services/, and nothing that links or runs
# (OPTIMIZE_DEPENDENCIES: an object waits for generated headers only, not
# for the libraries its target links; load/'s benchmarks would wait for
# the servers they start).
mapfile -t objects < <(ninja -C build-clang -t targets all | sed -n 's/^\(services\/.*\.o\): .*/\1/p')
log=build-clang/thread_safety.log
ninja -C build-clang -k 0 -j2 "${objects[@]}" >"$log" 2>&1 || true

status=0
if grep -qE -- '\[-W(error,-W)?thread-safety' "$log"; then
  grep -B2 -A4 -E -- '\[-W(error,-W)?thread-safety' "$log" >&2
  echo "thread_safety_check: the analysis found the above" >&2
  status=1
fi
unchecked=()
for source in $(sed -n 's/^FAILED: .*\.dir\/\(.*\)\.o $/\1/p' "$log"); do
  file=services/$source
  if [ -f "$file" ] && grep -qE 'absl::Mutex|ABSL_GUARDED_BY|ABSL_EXCLUSIVE_LOCKS_REQUIRED' "$file"; then
    echo "thread_safety_check: $file holds mutexes and did not compile under clang:" >&2
    grep -A8 "$source" "$log" | head -12 >&2
    status=1
  else
    unchecked+=("$file")
  fi
done
echo "thread_safety_check: ${#objects[@]} files, ${#unchecked[@]} not compiled by clang 14 and without mutexes:" \
  "${unchecked[*]:-none}"
[ "$status" -eq 0 ] && echo "thread_safety_check: no findings"
exit "$status"
