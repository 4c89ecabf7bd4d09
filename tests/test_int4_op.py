"""`multistage_gemm_q` called directly (packed layout in, dense out) vs a float64 reference.

One graph with symbolic M, N, Kp holds five op instances (dtypes, group sizes, zeros, bias), so
the op compiles once per device; every (M, N, Kp) below runs through it: N not a multiple of
64 (masked columns), M not a multiple of any tile, Kp of one and of three K tiles.
tests/test_int4_graph.py covers the same op from checkpoints through `Int4Linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, TensorType, ops
from max.graph import Module as GraphModule

from mojo_gemm import kernels_package
from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy
from mojo_gemm.int4.layout import pack_codes, padded_shape, permute_group_params

OP = "multistage_gemm_q"
REL_TOL = 1e-2
M_VALUES = (1, 7, 16, 23, 33, 42, 300)

pytestmark = pytest.mark.slow  # compiles one graph per device


@dataclass(frozen=True)
class Config:
    """One op instance of the test graph."""

    dtype: DType
    group_size: int  # -1: per-channel
    has_zeros: bool
    has_bias: bool

    @property
    def name(self) -> str:
        return f"{self.dtype}_g{self.group_size}_z{int(self.has_zeros)}_b{int(self.has_bias)}"


CONFIGS = [
    Config(DType.bfloat16, 128, False, True),
    Config(DType.bfloat16, 32, True, False),
    Config(DType.bfloat16, -1, True, True),
    Config(DType.float16, 64, True, True),
    Config(DType.float16, -1, False, False),
]
DTYPES = [DType.bfloat16, DType.float16]


def _groups_dim(cfg: Config) -> str:
    return "g_all" if cfg.group_size < 0 else f"g{cfg.group_size}"


def build_graph(dev: DeviceRef, module: GraphModule | None = None) -> Graph:
    """Inputs: x_<dtype> [m, kp], qweight [nb, kw], per config scales (+ zeros) [groups, np],
    bias_<dtype> [1, n]; one output [m, n] per config. Dummies: zeros [1, 1], bias [1, 1].
    Built into `module` if given."""
    input_types = [TensorType(dt, ["m", "kp"], dev) for dt in DTYPES]
    input_types.append(TensorType(DType.uint32, ["nb", "kw"], dev))
    input_types += [TensorType(dt, [1, "n"], dev) for dt in DTYPES]
    for cfg in CONFIGS:
        input_types.append(TensorType(cfg.dtype, [_groups_dim(cfg), "np"], dev))
        if cfg.has_zeros:
            input_types.append(TensorType(cfg.dtype, [_groups_dim(cfg), "np"], dev))
    with Graph("int4_gemm_test", input_types=input_types, module=module,
               custom_extensions=[kernels_package()]) as g:
        inputs = iter(v.tensor for v in g.inputs)
        xs = {dt: next(inputs) for dt in DTYPES}
        qweight = next(inputs)
        biases = {dt: next(inputs) for dt in DTYPES}
        outs = []
        for cfg in CONFIGS:
            x = xs[cfg.dtype]
            scales = next(inputs)
            zeros = next(inputs) if cfg.has_zeros else ops.constant([[0.0]], cfg.dtype, dev)
            bias = biases[cfg.dtype] if cfg.has_bias else ops.constant([[0.0]], cfg.dtype, dev)
            outs.append(
                ops.custom(
                    OP,
                    dev,
                    [x, qweight, scales, zeros, bias],
                    [TensorType(cfg.dtype, [x.shape[0], biases[cfg.dtype].shape[1]], dev)],
                    parameters={
                        "group_size": cfg.group_size,
                        "has_zeros": cfg.has_zeros,
                        "has_bias": cfg.has_bias,
                    },
                )[0]
            )
        g.output(*outs)
    return g


def rounded(a: np.ndarray, dt: DType) -> np.ndarray:
    """`a` rounded to dt's precision, as float64 (what the op sees)."""
    return np.asarray(a).astype(numpy_dtype(dt)).astype(np.float64)


@dataclass
class Case:
    """Random problem for one (M, N, Kp): shared x / codes / bias, per-config scales / zeros."""

    feeds: list[Buffer]
    expected: list[np.ndarray]


def make_case(m: int, n: int, kp: int, rng: np.random.Generator, device: Device) -> Case:
    """Fresh random inputs on `device` and the float64 reference outputs of every config."""
    np_, kp_check = padded_shape(n, kp)
    assert kp_check == kp
    x = {dt: rounded(rng.uniform(-1, 1, (m, kp)), dt) for dt in DTYPES}
    bias = {dt: rounded(rng.uniform(-1, 1, n), dt) for dt in DTYPES}
    codes = rng.integers(0, 16, (np_, kp), dtype=np.uint8)
    feeds = [to_buffer(x[dt], dt) for dt in DTYPES]
    feeds.append(Buffer.from_numpy(pack_codes(codes)))
    feeds += [to_buffer(bias[dt][None, :], dt) for dt in DTYPES]
    expected = []
    for cfg in CONFIGS:
        g = kp if cfg.group_size < 0 else cfg.group_size
        scales = rounded(rng.uniform(0.002, 0.02, (kp // g, np_)), cfg.dtype)
        zeros = rng.integers(0, 16, (kp // g, np_)).astype(np.float64) if cfg.has_zeros else None
        feeds.append(to_buffer(permute_group_params(scales), cfg.dtype))
        if zeros is not None:
            feeds.append(to_buffer(permute_group_params(zeros), cfg.dtype))
        z = np.repeat(zeros if zeros is not None else np.full_like(scales, 8.0), g, axis=0)
        w = (codes.T.astype(np.float64) - z) * np.repeat(scales, g, axis=0)  # Wᵀ [kp, np]
        ref = x[cfg.dtype] @ w[:, :n]
        if cfg.has_bias:
            ref += bias[cfg.dtype]
        expected.append(ref)
    return Case([f.to(device) for f in feeds], expected)


def load(kind: str) -> tuple[Model, Device]:
    """The test graph compiled for `kind` ("cpu" or "gpu") and its device."""
    if kind == "gpu":
        device: Device = Accelerator()
        session = InferenceSession(devices=[CPU(), device])
        return session.load(build_graph(DeviceRef.GPU())), device
    return graph_pool.model("int4_gemm_test"), CPU()


graph_pool.register("int4_gemm_test", lambda module: (build_graph(DeviceRef.CPU(), module), {}))


@pytest.fixture(scope="module")
def cpu_model() -> tuple[Model, Device]:
    return load("cpu")


@pytest.fixture(scope="module")
def gpu_model() -> tuple[Model, Device]:
    return load("gpu")


def check_all(model: Model, device: Device, kind: str) -> None:
    """Every (M, N, Kp) and config against the float64 reference."""
    for m in M_VALUES:
        for n in (8, 72, 200):
            for kp in (128, 384):
                case = make_case(m, n, kp, np.random.default_rng(1000 * m + 10 * n + kp), device)
                outs = model.execute(*case.feeds)
                for cfg, out, ref in zip(CONFIGS, outs, case.expected, strict=True):
                    got = to_numpy(out).astype(np.float64)
                    assert got.shape == (m, n), cfg.name
                    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
                    assert err <= REL_TOL, (
                        f"{kind} {cfg.name} m={m} n={n} kp={kp}: rel err {err:.3e}")


def test_cpu_matches_reference(cpu_model: tuple[Model, Device]) -> None:
    """CPU path: every shape and config within 1e-2 of float64."""
    check_all(*cpu_model, "cpu")


@pytest.mark.gpu
def test_gpu_matches_reference(gpu_model: tuple[Model, Device]) -> None:
    """GPU path (tensor-core kernels, every dispatch size): within 1e-2 of float64."""
    check_all(*gpu_model, "gpu")


def test_cpu_rejects_inconsistent_shapes(cpu_model: tuple[Model, Device]) -> None:
    """Scales of the wrong group count raise at run time instead of reading out of bounds."""
    model, device = cpu_model
    case = make_case(4, 72, 384, np.random.default_rng(7), device)
    feeds = list(case.feeds)
    first_scales = len(DTYPES) * 2 + 1  # x per dtype, qweight, bias per dtype
    feeds[first_scales] = to_buffer(np.ones((384 // 64, 128)), CONFIGS[0].dtype)  # g = 64, not 128
    with pytest.raises(Exception, match="group"):
        model.execute(*feeds)
