"""The environment for child Python processes of the tests.

A child started as `sys.executable` does not always see this interpreter's venv (seen in CI
runs on this machine: after graph builds, `.venv/bin/python` children came up with the base
interpreter's prefix and without `max`), so the children get this process's `sys.path`.
"""

from __future__ import annotations

import os
import sys


def child_env() -> dict[str, str]:
    """os.environ plus PYTHONPATH = this interpreter's sys.path (absolute entries)."""
    paths = [p for p in sys.path if p and os.path.isabs(p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
