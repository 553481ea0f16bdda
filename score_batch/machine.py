"""What this machine and process have: the CPUs the process may use, the scoring device's name, the process's age,
glibc malloc tuned for a run's tensors and the garbage collector for its rows (the CLI's and each Ray actor's
process; docs/operations.md)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPUs the scheduler lets this process run on, capped by the cgroup v2/v1 CPU quota (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def _cgroup_quota() -> float | None:
    """The CPU quota in CPUs (cgroup v2 cpu.max, else v1 cfs files), None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def device_name(device: str) -> str:
    """The scoring device in words: the GPU's name (torch, when a CUDA run imported it) or the CPU's model."""
    if device.startswith("cuda") and "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or device or "unknown"


def seconds_since_start() -> float:
    """Seconds since this process started (Linux /proc; 0.0 where that is not readable)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError):
        return 0.0


# glibc malloc serves each allocation above its (adaptive, ≤ 32 MiB) mmap threshold with a fresh mapping and
# unmaps it on free, and trims the heap top past 128 KiB: every forward pass then page-faults its activations
# in again (13% of the CPU time was kernel time on the CPU benchmark, 4% tuned). A fixed 256 MiB mmap threshold
# and a 1 GiB trim threshold keep that memory mapped for the next batch; the peak is unchanged, the process
# keeps up to the trim threshold above what it uses. glibc's own MALLOC_MMAP_THRESHOLD_ /
# MALLOC_TRIM_THRESHOLD_ variables, or a preloaded jemalloc/tcmalloc, win.
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 2**20
TRIM_THRESHOLD = 2**30
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def tune_malloc(environ: Mapping[str, str]) -> bool:
    """Set the two thresholds on glibc (Linux) unless the user chose malloc settings; whether they were set."""
    if not sys.platform.startswith("linux"):
        return False
    if any(name in environ for name in USER_SETTINGS):
        log.debug("malloc: left as the environment sets it")
        return False
    if any(name in environ.get("LD_PRELOAD", "") for name in OTHER_ALLOCATORS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        done = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        done = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    except (OSError, AttributeError):
        return False
    log.debug(
        "malloc: mmap threshold %d MiB, trim threshold %d MiB", MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20
    )
    return done


GC_YOUNG_ALLOCATIONS = 100_000  # allocations between young collections (Python's default: 700)
GC_OLDER_COLLECTIONS = (50, 100)  # collections of each generation before the next one up (defaults: 10, 10)


def tune_gc() -> None:
    """Fewer garbage-collector passes (docs/operations.md): the imported libraries frozen out of every pass, a
    young collection every GC_YOUNG_ALLOCATIONS allocations (rescanning rows: 25% of a dry run's time)."""
    import gc

    gc.freeze()
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, *GC_OLDER_COLLECTIONS)
