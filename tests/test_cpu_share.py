"""llama.cpp's thread count on a shared CPU (llm/cpu_share.py): a core another process keeps busy is left out,
and taken back when it is free again. A real spinning process, the real /proc."""

from __future__ import annotations

import subprocess
import sys
import time

from llm.cpu_share import CpuShare


def _settle(share: CpuShare, want: int, within_s: float = 8.0) -> int:
    deadline = time.monotonic() + within_s
    while (got := share.threads()) != want and time.monotonic() < deadline:
        time.sleep(0.3)
    return got


def test_a_core_kept_busy_by_another_process_is_left_out_and_taken_back():
    share = CpuShare(cpus=2)  # as on a 2-core machine, whatever this one has: others' use is counted in cores
    assert share.ok and share.threads() == 2  # nothing measured yet: every core
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert _settle(share, 1) == 1, share.others_busy()
    finally:
        spinner.kill()
        spinner.wait()
    assert _settle(share, 2) == 2  # the core is free again


def test_this_process_s_own_work_is_not_someone_else_s():
    share = CpuShare(cpus=2)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # a busy loop here, in this process: ours, not another program's
        pass
    others = share.others_busy()
    assert others is not None and others < 0.5, others
