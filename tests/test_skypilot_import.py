"""Importing the SkyPilot backend package (and building the backend) does not import SkyPilot."""

from __future__ import annotations

import subprocess
import sys


def test_skypilot_package_imports_no_sky() -> None:
    code = (
        "import sys\n"
        "import mncloud.backends.skypilot as pkg\n"
        "from mncloud.backends.registry import get_backend\n"
        "backend = get_backend('skypilot')\n"
        "assert isinstance(backend, pkg.SkyPilotBackend)\n"
        "print('LOADED', 'sky' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("LOADED False")
