"""Where the Mojo kernel package is, and how a graph gets it.

An installed wheel carries the kernels as package data (`mojo_gemm/mojo_kernels/`); a source
checkout (editable install or PYTHONPATH=python) has them at the repository root. The wheel's
copy wins so an installed package never depends on the directory it was built from.
"""

from __future__ import annotations

from pathlib import Path

from max.graph import Graph

_HERE = Path(__file__).resolve().parent
_CANDIDATES = (_HERE / "mojo_kernels", _HERE.parents[1] / "mojo_kernels")


def kernels_path() -> Path:
    """The directory of the Mojo package (holds `__init__.mojo`) to hand to MAX.

    Pass it as `custom_extensions=[kernels_path()]` to `Graph(...)`, `session.load` or
    `Module.compile`; the graph functions of this package also add it to the current graph.
    """
    for candidate in _CANDIDATES:
        if (candidate / "__init__.mojo").is_file():
            return candidate
    raise FileNotFoundError(
        "mojo_gemm: Mojo kernels not found; looked in " + ", ".join(map(str, _CANDIDATES))
    )


def ensure_kernels_loaded() -> None:
    """Adds the kernel package to the graph being built, unless it is already there.

    Uses MAX's `Graph._import_kernels` (what `Graph(custom_extensions=...)` calls), so model code
    need not pass `custom_extensions` itself.
    """
    graph = Graph.current
    path = kernels_path()
    if path.resolve() not in {Path(p).resolve() for p in graph.kernel_libraries_paths}:
        graph._import_kernels([path])
