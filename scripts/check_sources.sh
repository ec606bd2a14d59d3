#!/usr/bin/env bash
# The sources' static checks, each naming the files it fails on: every C++
# and CUDA source as clang-format writes it under .clang-format (so that a
# change's diff carries only its own lines; fix: clang-format -i FILE...),
# and every Python file clean under pyflakes (unused imports and names,
# undefined names).
set -euo pipefail
cd "$(dirname "$0")/.."
python=/usr/bin/python3  # Debian's, with the packages scripts/setup.sh installs
if ! command -v clang-format >/dev/null || ! $python -m pyflakes --version >/dev/null 2>&1; then
  echo "check_sources: needs clang-format and pyflakes (scripts/setup.sh installs them)" >&2
  exit 1
fi

# Tracked files ending in each of "$@" (a copy without git: the source
# folders').
sources() {
  if [ -e .git ]; then
    local patterns=()
    for ext in "$@"; do patterns+=("*.$ext"); done
    git ls-files "${patterns[@]}"
  else
    local names=()
    for ext in "$@"; do names+=(${names:+-o} -name "*.$ext"); done
    find clients kernels load models scripts services tests -name build -prune -o \( "${names[@]}" \) -print
  fi
}

status=0
mapfile -t cpp < <(sources cc h cu cuh)
# Each finding starts "FILE:LINE:COL: error:".
mapfile -t drifted < <(printf '%s\0' "${cpp[@]}" | xargs -0 -n 64 -P 2 clang-format --dry-run 2>&1 |
  sed -nE 's/^([^: ]+):[0-9]+:[0-9]+: (error|warning):.*/\1/p' | sort -u)
if [ "${#drifted[@]}" -gt 0 ]; then
  printf '%s\n' "${drifted[@]}" >&2
  echo "check_sources: ${#drifted[@]} of ${#cpp[@]} files (above) are not as clang-format writes them;" \
    "run: clang-format -i ${drifted[*]}" >&2
  status=1
else
  echo "check_sources: ${#cpp[@]} C++ and CUDA files as clang-format writes them"
fi

mapfile -t py < <(sources py)
if ! $python -m pyflakes "${py[@]}" >&2; then
  echo "check_sources: pyflakes found the above" >&2
  status=1
else
  echo "check_sources: ${#py[@]} Python files clean under pyflakes"
fi
exit $status
