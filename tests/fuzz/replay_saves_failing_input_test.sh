#!/usr/bin/env bash
# The replay driver writes an input that breaks a property, and one that
# crashes the target, to fuzz-failure-<target>-<seed> in its working
# directory, byte for byte, and fails. Usage: $0 <fuzz_broken_on_purpose>
set -euo pipefail
program=$(readlink -f "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
for kind in break crash; do
  printf '%s\000\377 and more bytes' "$kind" > "input-$kind"
  rm -f fuzz-failure-*
  if KVTIER_TEST_SEED=7 "$program" "input-$kind" > "out-$kind" 2>&1; then
    echo "FAIL: $kind: the driver exited 0"; cat "out-$kind"; exit 1
  fi
  saved=fuzz-failure-$(basename "$program")-7
  if ! cmp -s "input-$kind" "$saved"; then
    echo "FAIL: $kind: $saved is not the input"; cat "out-$kind"; ls -la; exit 1
  fi
  grep -q "failing input written to $dir/$saved" "out-$kind" || { echo "FAIL: $kind: not said"; cat "out-$kind"; exit 1; }
  echo "$kind: written to $saved and said"
done
# Inputs that hold every property leave no file.
printf 'fine' > input-fine
rm -f fuzz-failure-*
"$program" input-fine > out-fine 2>&1 || { echo "FAIL: a good input failed"; cat out-fine; exit 1; }
if compgen -G 'fuzz-failure-*' > /dev/null; then echo "FAIL: a file was written for a good input"; exit 1; fi
echo "PASS"
