"""Where the Mojo kernel package is, and how a graph gets it.

An installed wheel carries the kernels as package data (`mojo_gemm/mojo_kernels/`); a source
checkout (editable install or PYTHONPATH=python) has them at the repository root. The wheel's
copy wins so an installed package never depends on the directory it was built from.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
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
    of the kernels and the Mojo toolchain, written atomically; processes that ask at once
    share one build (a file lock).
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
        target.parent.mkdir(parents=True, exist_ok=True)
        with _build_lock(target.parent / ".lock"):
            # a process that held the lock before this one has built it: nothing to do
            if not target.is_file():
                _precompile(source, target)
    except Exception:  # no cache dir, no driver, a compile error: MAX reports it from source
        return source
    return target


@contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on `path` (created if missing) while the body runs.

    Processes that start together (the test suite's main process and its child compiles) would
    otherwise each precompile the package, ~12 CPU-s apiece on a machine that has none to
    spare: the later ones wait for the first build and use it. Without fcntl (Windows) no lock
    is taken; the atomic rename still keeps parallel builds safe.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _precompile(source: Path, target: Path) -> None:
    """`mojo precompile source -o target`, written atomically."""
    from mojo.run import subprocess_run_mojo

    # the compiler takes the module name from the output file's stem: stage under that name
    staging = target.parent / f".staging.{os.getpid()}" / target.name
    staging.parent.mkdir(parents=True, exist_ok=True)
    subprocess_run_mojo(["precompile", str(source), "-o", str(staging)],
                        capture_output=True, check=True)
    os.replace(staging, target)
    staging.parent.rmdir()


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
