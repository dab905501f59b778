"""Test helper: `specvoice -c small bench NAME FLAGS` as a user runs it, in a fresh process started in the test's
folder (where it writes its JSON), with this checkout first on the import path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(tmp_path: Path, name: str, *flags: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voice.app.cli", "-c", "small", "bench", name, *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}},
    )
