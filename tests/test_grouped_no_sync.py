"""`grouped_matmul` on the GPU has no host synchronisation and no device-to-host read inside.

Two kinds of evidence (GPU tests, an H200 for sm_90a):
- device-graph capture: a MAX graph with the op (functional and in place; decode- and
  prefill-sized token tiles) is captured once (`Model.capture`, a CUDA graph), then replayed
  after new activations and NEW routing data (offsets, expert ids, usage stats) were written
  into the captured input buffers; every replay matches float64 numpy for its own routing. A
  host read of the routing would have been frozen into the graph at capture time (or broken the
  capture), so the replays would reproduce the first routing;
- host timing (tests/mojo/grouped_no_sync.mojo): with the GPU held busy by a spin kernel, the
  registered op's execute["gpu"] returns in a tiny fraction of the spin, and the result computed
  after the spin follows routing data that only arrived behind the spin.
The cross-compile test builds that program for sm_90a without a GPU (slow).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType

from mojo_gemm.core.host import to_buffer, to_numpy
from mojo_gemm.grouped.op import grouped_matmul

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from check_ptx import MOJO, MOJO_ENV  # noqa: E402  (the compiler that came with max)

PROGRAM = ROOT / "tests" / "mojo" / "grouped_no_sync.mojo"
E, K, N = 4, 264, 200  # N, K not multiples of the tiles
# the SM90 token tile is the narrowest a typical group (mean + 2 sqrt(mean) rows) fits:
# T_DEC / G = 20 rows: decode tiles (BN = 32); T_PRE / G = 150: prefill tiles (BN = 256)
T_DEC, T_PRE = 80, 600
POISON = -4321.0
KEY = 7


@dataclass(frozen=True)
class Routing:
    """offsets [G + 1], expert ids [G], usage stats [max rows of a group, G_active]; G = 4."""

    offsets: tuple[int, ...]
    ids: tuple[int, ...]
    stats: tuple[int, int]

    def buffers(self) -> list[Buffer]:
        """Host buffers: u32 offsets, i32 ids, u32 stats."""
        return [Buffer.from_numpy(np.array(self.offsets, np.uint32)),
                Buffer.from_numpy(np.array(self.ids, np.int32)),
                Buffer.from_numpy(np.array(self.stats, np.uint32))]


# (decode routing over T_DEC rows, prefill routing over T_PRE rows), one pair per replay
ROUTINGS = (
    (Routing((0, 25, 26, 58, 80), (2, 0, 3, 1), (32, 4)),
     Routing((0, 240, 241, 500, 600), (1, 3, 0, 2), (259, 4))),
    # a -1 expert (zero rows) and G_active = 3 < G: the last group's rows are not written
    (Routing((0, 10, 42, 67, 80), (3, -1, 0, 2), (32, 3)),
     Routing((0, 14, 400, 520, 600), (0, 2, -1, 3), (386, 3))),
    # one group owns every row
    (Routing((0, 80, 80, 80, 80), (1, 0, 0, 0), (80, 1)),
     Routing((0, 600, 600, 600, 600), (3, 0, 0, 0), (600, 1))),
)


def reference(r: Routing, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 c [T, N], bool [T] rows written) for one routing."""
    c = np.zeros((a.shape[0], b.shape[1]))
    written = np.zeros(a.shape[0], bool)
    for g in range(min(r.stats[1], len(r.ids))):
        lo, hi, e = r.offsets[g], r.offsets[g + 1], r.ids[g]
        written[lo:hi] = True
        if 0 <= e < b.shape[0]:
            c[lo:hi] = a[lo:hi] @ b[e].T
    return c, written


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Relative Frobenius error."""
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def build_model(session: InferenceSession) -> Model:
    """The op twice (decode-sized functional + in place, prefill-sized functional)."""
    gpu, bf16 = DeviceRef.GPU(), DType.bfloat16
    route = [TensorType(DType.uint32, [E + 1], gpu), TensorType(DType.int32, [E], gpu),
             TensorType(DType.uint32, [2], gpu)]
    types = [TensorType(bf16, [T_DEC, K], gpu), TensorType(bf16, [T_PRE, K], gpu),
             TensorType(bf16, [E, N, K], gpu), BufferType(bf16, [T_DEC, N], gpu), *route, *route]
    with Graph("grouped_capture", input_types=types) as g:
        a_dec, a_pre, b, c_dec, *rest = g.inputs
        dec, pre = [v.tensor for v in rest[:3]], [v.tensor for v in rest[3:]]
        y_dec = grouped_matmul(a_dec.tensor, b.tensor, *dec)
        grouped_matmul(a_dec.tensor, b.tensor, *dec, out=c_dec.buffer)
        y_pre = grouped_matmul(a_pre.tensor, b.tensor, *pre)
        g.output(y_dec, y_pre)
    return session.load(g)


@functools.cache
def gpu_model() -> tuple[Accelerator, Model]:
    """The accelerator and the compiled capture graph (one compile for the tests below)."""
    acc = Accelerator()
    return acc, build_model(InferenceSession(devices=[CPU(), acc]))


@pytest.mark.gpu
def test_capture_then_replay_follows_new_routing() -> None:
    """Captured once, replayed with new activations and routing: each replay is right."""
    acc, model = gpu_model()
    rng = np.random.default_rng(44)

    def bf16_values(shape: tuple[int, ...]) -> np.ndarray:
        return to_numpy(to_buffer(rng.standard_normal(shape), DType.bfloat16)).astype(np.float64)

    b = bf16_values((E, N, K))
    poison = to_buffer(np.full((T_DEC, N), POISON), DType.bfloat16)
    poison_value = to_numpy(poison)[0, 0]  # POISON rounded to bf16
    a_dec, a_pre = bf16_values((T_DEC, K)), bf16_values((T_PRE, K))
    inputs = [to_buffer(a_dec, DType.bfloat16).to(acc), to_buffer(a_pre, DType.bfloat16).to(acc),
              to_buffer(b, DType.bfloat16).to(acc), poison.copy(acc)]
    inputs += [x.to(acc) for r in ROUTINGS[0] for x in r.buffers()]
    y_dec, y_pre = model.capture(KEY, *inputs)

    for i, (r_dec, r_pre) in enumerate(ROUTINGS):
        # host sources stay referenced until the copies are done (a copy may be asynchronous)
        staged = [poison]
        if i:  # new data into the captured buffers (same addresses), outputs poisoned
            a_dec, a_pre = bf16_values((T_DEC, K)), bf16_values((T_PRE, K))
            staged = [to_buffer(a_dec, DType.bfloat16), to_buffer(a_pre, DType.bfloat16),
                      poison, *r_dec.buffers(), *r_pre.buffers()]
            for dst, src in zip([*inputs[:2], inputs[3], *inputs[4:]], staged, strict=True):
                dst.inplace_copy_from(src)
        y_dec.inplace_copy_from(poison)
        inputs[3].inplace_copy_from(poison)
        acc.synchronize()
        del staged
        model.replay(KEY, *inputs)
        acc.synchronize()
        ref_dec, written_dec = reference(r_dec, a_dec, b)
        ref_pre, written_pre = reference(r_pre, a_pre, b)
        got_inplace = to_numpy(inputs[3]).astype(np.float64)
        for name, got, ref, written in (
            ("decode", to_numpy(y_dec), ref_dec, written_dec),
            ("decode in place", got_inplace, ref_dec, written_dec),
            ("prefill", to_numpy(y_pre), ref_pre, written_pre),
        ):
            err = rel_err(got[written].astype(np.float64), ref[written])
            assert err <= 1e-2, f"replay {i} {name}: rel. Frobenius error {err:.3e}"
        assert np.all(got_inplace[~written_dec] == poison_value), (
            f"replay {i}: rows of inactive groups were written")


@pytest.mark.gpu
def test_capture_launch_trace_matches_eager() -> None:
    """MAX's debug_verify_replay: an eager run launches what the capture recorded (it raises
    otherwise); the replay after it is still right."""
    acc, model = gpu_model()
    rng = np.random.default_rng(45)
    a_dec, a_pre = (to_numpy(to_buffer(rng.standard_normal((t, K)), DType.bfloat16))
                    for t in (T_DEC, T_PRE))
    b = to_numpy(to_buffer(rng.standard_normal((E, N, K)), DType.bfloat16))
    r_dec, r_pre = ROUTINGS[1]
    host = [to_buffer(a_dec, DType.bfloat16), to_buffer(a_pre, DType.bfloat16),
            to_buffer(b, DType.bfloat16), to_buffer(np.zeros((T_DEC, N)), DType.bfloat16),
            *r_dec.buffers(), *r_pre.buffers()]
    inputs = [x.copy(acc) for x in host]
    acc.synchronize()
    y_dec, _ = model.capture(KEY + 1, *inputs)
    model.debug_verify_replay(KEY + 1, *inputs)
    model.replay(KEY + 1, *inputs)
    acc.synchronize()
    ref, written = reference(r_dec, a_dec.astype(np.float64), b.astype(np.float64))
    err = rel_err(to_numpy(y_dec)[written].astype(np.float64), ref[written])
    assert err <= 1e-2, f"replay after debug_verify_replay: rel. Frobenius error {err:.3e}"


def build_program(exe: Path) -> subprocess.CompletedProcess[str]:
    """Cross-compiles tests/mojo/grouped_no_sync.mojo for sm_90a into `exe`."""
    return subprocess.run(
        [MOJO, "build", "-I", str(ROOT), "--target-accelerator", "sm_90a", str(PROGRAM),
         "-o", str(exe)],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=MOJO_ENV,
    )


@pytest.mark.slow
def test_no_sync_program_builds_for_sm90a() -> None:
    """The host-timing program compiles for the H200 (no GPU needed)."""
    with tempfile.TemporaryDirectory() as tmp:
        build = build_program(Path(tmp) / "grouped_no_sync")
        assert build.returncode == 0, build.stderr[-6000:]
        assert (Path(tmp) / "grouped_no_sync").is_file()


@pytest.mark.gpu
def test_op_call_returns_while_gpu_is_busy() -> None:
    """Each op call returns in < 5% of a 300 ms spin ahead of it, and the result follows routing
    data that reached the device only after the spin."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "grouped_no_sync"
        build = build_program(exe)
        assert build.returncode == 0, build.stderr[-6000:]
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        cases = [line for line in run.stdout.splitlines() if " | spin " in line]
        assert len(cases) == 2 and all(line.endswith(" PASS") for line in cases), run.stdout
        assert "NO HOST SYNC: PASS" in run.stdout, run.stdout
