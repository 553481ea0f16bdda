"""score_batch/machine.py: after tuning, a freed 64 MiB block stays in the heap; the user's own malloc settings win."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from score_batch.machine import tune_malloc

PROBE = """
import ctypes, json, sys
from score_batch.machine import tune_malloc

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
tuned = tune_malloc(json.loads(sys.argv[1]))
before = libc.mallinfo2().hblkhd
block = libc.malloc(64 << 20)
mapped = libc.mallinfo2().hblkhd - before  # bytes served by a fresh mapping (unmapped again on free)
libc.free(block)
print(json.dumps({"tuned": tuned, "mapped": mapped}))
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallinfo2")
    except OSError:
        return False


def probe(environ: dict) -> dict:
    import json

    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(environ)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc_with_mallinfo2(), reason="glibc only")
def test_a_tuned_process_serves_a_64_mib_block_from_the_heap():
    assert probe({}) == {"tuned": True, "mapped": 0}


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc_with_mallinfo2(), reason="glibc only")
@pytest.mark.parametrize(
    "environ",
    [
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
        {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"},
    ],
    ids=["glibc variable", "tunables", "jemalloc"],
)
def test_the_users_malloc_settings_win(environ):
    # The probe's environment is not really changed: tune_malloc only reads the mapping it is given.
    result = probe(environ)
    assert result["tuned"] is False
    assert result["mapped"] >= 64 << 20  # glibc's default: a block this large is its own mapping


def test_other_platforms_are_left_alone(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert tune_malloc({}) is False


def test_the_cli_process_tunes_its_garbage_collector():
    """tune_gc freezes what start-up allocated and spaces young collections out (the host path's rows and
    token lists); a fresh process shows both, and a cycle made after it is still collected."""
    code = (
        "import gc, json; from score_batch.machine import tune_gc, GC_YOUNG_ALLOCATIONS; tune_gc()\n"
        "class Node: pass\n"
        "a = Node(); a.me = a; import weakref; ref = weakref.ref(a); del a; gc.collect()\n"
        "print(json.dumps([gc.get_threshold()[0] == GC_YOUNG_ALLOCATIONS, gc.get_freeze_count() > 0, ref() is None]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert json.loads(result.stdout) == [True, True, True], result.stderr
