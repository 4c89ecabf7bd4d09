"""A second lane for the suite's slow child processes (GPU cross-compiles, PTX builds).

Graph compiles and `mojo build` use one core each, and CI has two: the tests that only wait for
a child process declare its command with the `background` marker (`Job`s), conftest starts
every selected test's jobs when collection ends, one child at a time and longest first, while
the in-process CPU tests run in the main lane; such a test then calls `run(job)`, which waits
for that child (or starts it now when it was not started early) and returns its result. The
checks stay in the tests: a job is only the command line. The first `run` call means the main
lane has reached the background tests (conftest sorts them last) and has nothing left to do but
wait, so from then on two children run at once: both cores stay busy to the end.
"""

from __future__ import annotations

import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest


@dataclass(frozen=True)
class Job:
    """One child process: argv, its time limit in seconds and working directory."""

    argv: tuple[str, ...]
    timeout: float
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] | None = None
    """The child's environment (None: this process's)."""
    seconds: float = field(default=0.0, compare=False)
    """About how long it takes cold on 2 cores: the lane starts the longest first."""


_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="background-lane")
_SLOTS = threading.Semaphore(1)
"""Children allowed at once: one while the main lane runs in-process tests, two after `widen`."""
_FUTURES: dict[Job, Future[subprocess.CompletedProcess[str]]] = {}
_PENDING: list[Job] = []
"""Jobs not started yet, in submission order: a worker takes the first one once it holds a
slot, so the longest jobs still start first."""
_RUNNING: set[subprocess.Popen[str]] = set()
_LOCK = threading.Lock()
_STATE = {"widened": False, "closed": False}


def _next() -> None:
    """One pool task per submitted job: waits for a slot, then runs the first pending job."""
    with _SLOTS:
        with _LOCK:
            if _STATE["closed"] or not _PENDING:  # shutdown released the slot: start nothing
                return
            job = _PENDING.pop(0)
            future = _FUTURES[job]
            if not future.set_running_or_notify_cancel():
                return
        try:
            future.set_result(_start(job))
        except BaseException as err:  # handed to the test waiting for it
            future.set_exception(err)


def _start(job: Job) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(list(job.argv), cwd=job.cwd, env=dict(job.env) if job.env else None,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _LOCK:
        _RUNNING.add(proc)
    try:
        out, err = proc.communicate(timeout=job.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\nbackground: timed out after {job.timeout:.0f} s"
    finally:
        with _LOCK:
            _RUNNING.discard(proc)
    return subprocess.CompletedProcess(list(job.argv), proc.returncode, out, err)


def submit(job: Job) -> Future[subprocess.CompletedProcess[str]]:
    """Queues `job` on the background lane (once: a job already queued is not repeated)."""
    with _LOCK:
        if job not in _FUTURES:
            _FUTURES[job] = Future()
            _PENDING.append(job)
            _POOL.submit(_next)
        return _FUTURES[job]


def widen() -> None:
    """Lets a second child run alongside the first (once; later calls do nothing)."""
    with _LOCK:
        if _STATE["widened"]:
            return
        _STATE["widened"] = True
    _SLOTS.release()


def run(job: Job) -> subprocess.CompletedProcess[str]:
    """The finished child process of `job` (stdout and stderr as text); waits for it. The main
    lane waits from here on, so the background lane widens to two children."""
    future = submit(job)
    widen()
    return future.result()


def jobs_of(item: pytest.Item) -> list[Job]:
    """The jobs that the `background` markers of a test item declare."""
    return [job for mark in item.iter_markers("background") for job in mark.args]


def shutdown() -> None:
    """Drops the jobs not started yet and kills the running child (end of the session)."""
    with _LOCK:
        _STATE["closed"] = True
        for future in _FUTURES.values():
            future.cancel()
        for proc in _RUNNING:
            proc.kill()
    widen()  # a worker still waiting for a slot gets it, sees `closed` and returns
    _POOL.shutdown(wait=False, cancel_futures=True)
