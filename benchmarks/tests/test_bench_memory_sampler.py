"""The memory benchmark's accounting: private PSS per process, shared-memory files counted once, the
peak of the sum against the sum of peaks, and config validation."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from dressage_bench.memory.config import MemoryBenchConfig
from dressage_bench.memory.sampler import Timeline
from dressage.errors import ConfigError

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux smaps_rollup")


_TOUCH = """
import os
import numpy as np
from dressage_bench.memory.sampler import smaps_private
before = smaps_private(os.getpid())
block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, every page written
after = smaps_private(os.getpid())
print(before, after)
"""


def test_private_pss_grows_with_touched_memory():
    # In a fresh process: in this one, threads and freed heap left by earlier tests move the reading.
    out = subprocess.run([sys.executable, "-c", _TOUCH], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before > 0 and after - before > 48 << 20


_SHARED_FILE = """
import mmap, os, sys
from dressage_bench.memory.sampler import ComponentSpec, MemorySampler
path, size = sys.argv[1], int(sys.argv[2])
with open(path, "w+b") as f:
    f.truncate(size)
    m = mmap.mmap(f.fileno(), size)
m[:] = b"\\1" * size  # allocate every page of the file
pid = os.getpid()
row = MemorySampler([ComponentSpec("writer", (pid,)), ComponentSpec("unit", (pid,))]).sample_once()
print(row["writer"], row["unit"])
"""


def test_a_shared_memory_file_mapped_by_two_components_is_counted_once_to_the_last():
    # In a fresh process, as above: threads left by earlier tests in this one allocate between the two
    # components' readings.
    path = f"/dev/shm/dressage-test-{uuid.uuid4().hex}"
    size = 8 << 20
    try:
        out = subprocess.run([sys.executable, "-c", _SHARED_FILE, path, str(size)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert out.returncode == 0, out.stderr
        writer, unit = map(int, out.stdout.split())
        assert unit - writer >= size  # the file is the unit's, not the writer's as well
        assert unit - writer < size + (1 << 20)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_peak_of_the_sum_is_at_one_instant():
    tl = Timeline(names=("a", "b"), metric=("a", "b"), t=[0.0, 1.0, 2.0],
                  values={"a": [10, 0, 5], "b": [0, 10, 5]})
    assert tl.peak("a") == tl.peak("b") == 10
    assert tl.master_peak() == (10, 0.0)  # not 20: the two never peak together
    assert tl.master() == [10, 10, 10]
    assert tl.peak("a", since=1.0) == 5


def test_config_rejects_bad_values_naming_the_flag():
    with pytest.raises(ConfigError, match="--dtypes"):
        MemoryBenchConfig(dtypes=("int8",))
    with pytest.raises(ConfigError, match="--placement"):
        MemoryBenchConfig(placement="nearby")
    with pytest.raises(ConfigError, match="--max-tokens"):
        MemoryBenchConfig(context_length=1024, max_tokens=1000)
    with pytest.raises(ConfigError, match="--preset"):
        MemoryBenchConfig.from_preset("huge")


def test_presets_and_headline_dtype():
    full = MemoryBenchConfig.from_preset("full", dtypes=("int32", "uint16"))
    assert full.trajectories == 256
    assert full.headline_dtype == "uint16"  # uint8 not measured: the last dtype
    assert MemoryBenchConfig.from_preset("small").headline_dtype == "uint8"
