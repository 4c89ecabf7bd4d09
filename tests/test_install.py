"""A non-editable install into a fresh venv finds the Mojo kernels inside the wheel and runs.

The check compiles test_fuzz_cpu's int4 graph with one op instance (group 128 with zero points:
the suite's CPU graphs are compiled together, so this graph's compile is its own) and runs it on
a fresh case.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import sys
from pathlib import Path
import numpy as np
import mojo_gemm
from max.driver import CPU
from max.engine import InferenceSession
from mojo_gemm.core.host import to_numpy

venv = Path(sys.prefix).resolve()
kernels = mojo_gemm.kernels_path().resolve()
assert venv in Path(mojo_gemm.__file__).resolve().parents, mojo_gemm.__file__
assert venv in kernels.parents, f"kernels not from the wheel: {kernels}"
sys.path.insert(0, sys.argv[1])  # tests/: the fuzz test's int4 graph and cases
from test_fuzz_cpu import int4_case, int4_graph
rng = np.random.default_rng(1)
variants = ((128, True),)
model = InferenceSession(devices=[CPU()]).load(int4_graph(variants=variants))
inputs, refs = [], []
for j, (group, zeros) in enumerate(variants):
    ins, ref, _ = int4_case(rng, 5, group, zeros, seed=j)
    inputs += ins
    refs.append(ref)
for out, ref in zip(model.execute(*inputs), refs):
    got = to_numpy(out)[:, : ref.shape[1]].astype(np.float64)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err
print("installed-ok", kernels)
"""


@pytest.mark.slow
def test_non_editable_install_in_fresh_venv(tmp_path: Path) -> None:
    """pip install (no -e) of a copy of the checkout; the run must use the wheel's kernels."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".gpu", ".gpu-bin", "__pycache__", "out", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # The fresh venv sees this interpreter's packages (max, numpy, hatchling) through a .pth
    # placed AFTER its own site-packages, so the freshly installed mojo_gemm shadows any other.
    fresh_site = Path(subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    outer = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (fresh_site / "outer.pth").write_text("\n".join(sorted(outer)) + "\n")
    # --ignore-installed: pip must not uninstall the outer environment's mojo-gemm, which it
    # sees through the .pth
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--ignore-installed", str(src)], check=True)
    shutil.rmtree(src)  # the installed package must not need the checkout it came from
    run = subprocess.run([py, "-c", CHECK, str(ROOT / "tests")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert "installed-ok" in run.stdout
