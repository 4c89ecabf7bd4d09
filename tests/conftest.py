"""Shared pytest setup: `gpu` tests skip cleanly on machines without an NVIDIA GPU, and the
child processes of the selected `background` tests start early on a second lane
(tests/background.py)."""

from __future__ import annotations

import threading

import pytest
from max.driver import accelerator_count

import background
from mojo_gemm import kernels_package


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "background(*jobs): child processes (background.Job) the test waits for; "
        "started when collection ends, on a second lane")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Moves every `background` test to the end (stable order otherwise), so the main lane
    waits for child processes only once its in-process tests are done; marks every `gpu` test
    as skipped when no accelerator is present."""
    items.sort(key=lambda item: item.get_closest_marker("background") is not None)
    if accelerator_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the kernel package's precompile (see below) and queues the jobs of every
    selected, not skipped test, longest first."""
    if session.config.option.collectonly:
        return
    # The main lane's graphs and most children need the precompiled kernel package: built
    # here in a thread (the compiler is a child process), the main lane's first tests run
    # meanwhile, and children that ask for it wait for this one build (a file lock) instead of
    # each doing it again.
    threading.Thread(target=kernels_package, name="kernels-precompile", daemon=True).start()
    jobs = [job for item in session.items if item.get_closest_marker("skip") is None
            for job in background.jobs_of(item)]
    for job in sorted(dict.fromkeys(jobs), key=lambda j: -j.seconds):
        background.submit(job)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    background.shutdown()
