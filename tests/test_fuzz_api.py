"""Random call sequences through the whole API never crash (see api_machine.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = int(os.environ.get("EAGLE3_FUZZ_API", "2000"))


def test_random_call_sequences(tiny_pair):
    result = subprocess.run([sys.executable, str(Path(__file__).with_name("api_machine.py")), str(tiny_pair[0]),
                             str(tiny_pair[1]), str(EXAMPLES)], capture_output=True, text=True, timeout=3000)
    assert result.returncode == 0, f"return code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert "PASSED" in result.stdout
