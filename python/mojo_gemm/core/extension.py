"""Where the Mojo kernel package is, and how a graph gets it.

An installed wheel carries the kernels as package data (`mojo_gemm/mojo_kernels/`); a source
checkout (editable install or PYTHONPATH=python) has them at the repository root. The wheel's
copy wins so an installed package never depends on the directory it was built from.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from max.graph import Graph

_PACKAGE = Path(__file__).resolve().parents[1]
"""The `mojo_gemm` directory (this module lives in its `core/`)."""
_CANDIDATES = (_PACKAGE / "mojo_kernels", _PACKAGE.parents[1] / "mojo_kernels")


def kernels_path() -> Path:
    """The directory of the Mojo package's sources (holds `__init__.mojo`).

    For custom_extensions use `kernels_package()`, the precompiled form that this package's
    graph functions add to every graph: one process must not load both (two definitions of
    every op, which crashes MAX 26.7's compile on a GPU).
    """
    for candidate in _CANDIDATES:
        if (candidate / "__init__.mojo").is_file():
            return candidate
    raise FileNotFoundError(
        "mojo_gemm: Mojo kernels not found; looked in " + ", ".join(map(str, _CANDIDATES))
    )


def _cache_dir() -> Path:
    root = os.environ.get("MOJO_GEMM_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(root) / "mojo_gemm" if root else Path.home() / ".cache" / "mojo_gemm"


@cache
def kernels_package() -> Path:
    """The kernel package precompiled once per source content (a `.mojoc` in the user cache).

    MAX precompiles a source directory again for every graph that names it (~5 s each); graphs
    built by this package's functions name this binary instead. Keyed by a hash of every file
    of the kernels and the Mojo toolchain, written atomically (parallel builders are safe).
    Falls back to the source directory if the precompile is not possible. Computed once per
    process (a model calls the graph functions once per layer).
    """
    source = kernels_path()
    digest = hashlib.sha256()
    import max as max_pkg

    digest.update(str(getattr(max_pkg, "__version__", "")).encode())
    for f in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(f.relative_to(source)).encode())
        digest.update(f.read_bytes())
    target = _cache_dir() / digest.hexdigest()[:24] / "mojo_kernels.mojoc"
    if target.is_file():
        return target
    try:
        from mojo.run import subprocess_run_mojo

        # the compiler takes the module name from the output file's stem: stage under that name
        staging = target.parent / f".staging.{os.getpid()}" / target.name
        staging.parent.mkdir(parents=True, exist_ok=True)
        subprocess_run_mojo(["precompile", str(source), "-o", str(staging)],
                            capture_output=True, check=True)
        os.replace(staging, target)
        staging.parent.rmdir()
    except Exception:  # no cache dir, no driver, a compile error: MAX reports it from source
        return source
    return target


def ensure_kernels_loaded() -> None:
    """Adds the kernel package to the graph being built, unless it is already there.

    Uses MAX's `Graph._import_kernels` (what `Graph(custom_extensions=...)` calls), so model code
    need not pass `custom_extensions` itself. A graph that already names the source directory
    (`kernels_path()`) keeps it; otherwise the precompiled `kernels_package()` is added.
    """
    graph = Graph.current
    loaded = {Path(p).resolve() for p in graph.kernel_libraries_paths}
    if kernels_path().resolve() in loaded:
        return
    package = kernels_package()
    if package.resolve() not in loaded:
        graph._import_kernels([package])
