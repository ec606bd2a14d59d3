"""keep_freed_heap: after a prefix's records are let go, the next prefix's
land in pages the process already has (no page faults), where glibc on its
own gives them back. Each case runs in a child: the setting is a process's."""
import os
import subprocess
import sys

import pytest

from kvtier import keep_freed_heap

RECORDS, RECORD_BYTES = 16, 1 << 20

# Reads a "prefix" of records twice (letting the first go), then prints the
# minor page faults the second read cost and how many pages it holds.
CHILD = f"""
import resource, sys
from kvtier import keep_freed_heap
if sys.argv[1] == "keep" and not keep_freed_heap():
    print("not glibc"); sys.exit(0)
def read_prefix():
    return [bytearray({RECORD_BYTES}) for _ in range({RECORDS})]  # bytearray(n) writes its n zeros
prefix = read_prefix()
del prefix
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
prefix = read_prefix()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, {RECORDS * RECORD_BYTES} // 4096)
"""


def faults_of_the_second_prefix(mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, check=True,
                         timeout=60).stdout.split()
    if out == ["not", "glibc"]:
        pytest.skip("this C library does not take glibc's thresholds")
    return int(out[0]), int(out[1])


def test_a_freed_prefix_is_written_again_without_faults():
    kept, pages = faults_of_the_second_prefix("keep")
    given_back, _ = faults_of_the_second_prefix("default")
    print(f"faults reading a {RECORDS} MiB prefix again: {kept} kept, {given_back} given back (of {pages} pages)")
    assert kept < pages / 100, "the freed prefix's pages were kept"
    assert given_back > pages / 2, "control: glibc on its own gives them back"


@pytest.mark.parametrize("kept", [0, 1, (1 << 30) + 1, -5])
def test_a_size_out_of_range_is_refused(kept):
    with pytest.raises(ValueError, match="kept_bytes"):
        keep_freed_heap(kept)
