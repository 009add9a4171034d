"""scripts/validate-gpu.sh on a machine without a GPU: it refuses with exit 2 and one line saying why, and
writes nothing; its bash parses."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "validate-gpu.sh"


def test_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_refuses_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has a GPU: the script would run the whole validation")
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no CUDA GPU visible to torch" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()
