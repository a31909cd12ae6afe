"""What test_recording_rules.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")


def rules(folder: Path) -> Path:
    path = folder / "unthrottle-rules.yml"
    out = subprocess.run([str(UNTHROTTLE), "prometheus-rules"], capture_output=True, text=True,
                         check=True)  # fmt: skip
    path.write_text(out.stdout)
    return path
