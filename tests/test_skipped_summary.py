"""Without CUDA the `cuda` tests are skipped, and pytest's last lines say how many and why (tests/conftest.py),
in the two test processes the suite runs in (pytest-xdist) as in one."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cuda_unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("processes", ["2", "0"])
def test_the_last_lines_count_the_cuda_tests_skipped_and_say_why(processes):
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is here: the cuda tests run")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", processes,
                           "tests/test_cuda_hardware.py", "tests/test_payloads.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    skipped = int(re.search(r"(\d+) skipped", proc.stdout).group(1))
    assert f"{skipped} tests marked cuda skipped: {reason}" in proc.stdout.splitlines()
