#!/usr/bin/env python3
"""Cross-compiles GPU harnesses for their target and greps the PTX for the instructions the
fast kernels must use (CI: no GPU needed).

    python scripts/check_ptx.py [--only NAME ...] [--list] [--keep DIR]
    python scripts/check_ptx.py --captured DIR --arch sm_90a

Each entry of CHECKS is (name, harness, arch, required, forbidden): the harness (a Mojo program
under the repository root, built with `mojo build -I <root> --target-accelerator <arch>
--emit asm`, which writes one .ptx per kernel) must yield PTX in which every `required`
regular expression matches at least once and no `forbidden` one matches; where `ptxas` is on
PATH, no kernel of it may spill more than `max_spill_bytes` per thread (`ptxas -v`, the
assembler's register allocation: spills the PTX cannot show; each limit is the most any kernel
of the check spills, so a change that adds spills fails). Add an entry to check another
kernel. Exit status 1 when any check fails; the summary names the missing patterns.

A check with a `kernel_prefix` can also run on the PTX a graph compile produced: the graph
compile of every op's specializations for sm_90a (scripts/compile_gpu_graphs.py --ptx-checks)
hands each kernel to scripts/ptxas-capture, which keeps its PTX and `ptxas -v` report, and
`--captured DIR` checks the kernels whose entry names start with the prefix. That is the code
users get (every specialization a graph can pick) and costs no build of its own, so CI checks
those there and builds harnesses only for the checks a graph does not cover.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def find_mojo() -> tuple[str, dict[str, str] | None]:
    """The Mojo compiler that came with the installed `max`, and its environment.

    The `mojo` console script of the pinned wheel (mojo 1.2.0) execs the driver binary with
    `mojo.run._mojo_env()`; doing the same here needs neither PATH nor the venv's bin/ (CI
    calls the venv's python directly). Falls back to `mojo` on PATH.
    """
    try:
        from mojo.run import _mojo_env

        env = _mojo_env()
        return env["MODULAR_MOJO_MAX_DRIVER_PATH"], env
    except (ImportError, KeyError):
        return shutil.which("mojo") or "mojo", None


MOJO, MOJO_ENV = find_mojo()

NO_SPILLS = (r"\bld\.local\b", r"\bst\.local\b")
"""Register spills / local arrays show up as ld.local / st.local."""


@dataclass(frozen=True)
class PtxCheck:
    """One harness built for one architecture and the PTX it must (not) contain."""

    name: str
    harness: str
    """Path of the Mojo program, relative to the repository root."""
    arch: str
    """--target-accelerator value, e.g. sm_90a or sm_100a."""
    required: tuple[str, ...]
    """Regular expressions that must each match somewhere in the harness's PTX."""
    forbidden: tuple[str, ...] = field(default=())
    """Regular expressions that must match nowhere."""
    max_spill_bytes: int | None = None
    """Most bytes of spill stores `ptxas -v` may report for any kernel (None: not checked)."""
    kernel_prefix: str | None = None
    """The entry-name prefix of the check's kernels in a graph compile's PTX (`--captured`;
    MAX names a kernel by its module path, cut to 30 characters); None: harness only."""


GROUPED_HARNESS = "tests/mojo/ptx_probe_grouped.mojo"
"""The grouped harness's case runner on the launcher's own path (bf16, bf16 SwiGLU + row scale,
fp16): the full harness also instantiates the forced Ampere and portable paths of both dtypes."""
INT4_HARNESS = "tests/mojo/ptx_probe_int4.mojo"
"""The int4 op's GPU entry point only: the full GPU test program
(tests/mojo/int4_gemm_gpu_test.mojo) is 55 MB of PTX and 180 CPU-s to build cold, this 8 MB and
40 CPU-s."""
K_CACHE_HARNESS = "tests/mojo/ptx_probe_k_cache.mojo"
"""One instantiation of the K-cache harness's case runner: the full harness (scripts/gpu-check
runs it) builds in ~100 CPU-s cold, the probe in ~20."""
MOE_ROUTE_HARNESS = "tests/mojo/moe_route_gpu_harness.mojo"
"""The router harness itself, both dtypes: a bf16-only probe would leave its fp16 kernels out
of the spill check, for ~3 CPU-s saved."""

CHECKS: tuple[PtxCheck, ...] = (
    PtxCheck(
        name="int4_sm90",
        kernel_prefix="mojo_kernels_int4_gemm_kernels",
        max_spill_bytes=60,  # one 3-warpgroup wgmma specialization of the sm_90a graph
        harness=INT4_HARNESS,
        arch="sm_90a",
        required=(
            r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16",  # M >= 17 kernel
            r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16",
            r"cp\.async\.bulk\.tensor\.2d",  # TMA activation tiles
            r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32",  # mma.sync kernels
        ),
    ),
    PtxCheck(
        name="k_cache_sm90",
        kernel_prefix="mojo_kernels_k_cache_matmul_ke",
        max_spill_bytes=140,
        harness=K_CACHE_HARNESS,
        arch="sm_90a",
        required=(
            r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3",
            r"cp\.async\.bulk\.tensor\.2d",
        ),
    ),
    PtxCheck(
        name="grouped_sm90",
        kernel_prefix="mojo_kernels_grouped_gemm_kern",
        max_spill_bytes=0,
        harness=GROUPED_HARNESS,
        arch="sm_90a",
        required=(
            r"wgmma\.mma_async\.sync\.aligned\.m64n32k16\.f32\.bf16\.bf16",  # decode tiles
            r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16",  # prefill tiles
            r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16",
            r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier",  # TMA
            r"mbarrier\.try_wait\.parity",
            r"mbarrier\.arrive\.expect_tx",
            r"setmaxnreg\.dec",
            r"setmaxnreg\.inc",
            # the prefill tiles' staged epilogue
            r"stmatrix\.sync\.aligned\.trans\.m8n8\.x4\.shared\.b16",
        ),
        forbidden=NO_SPILLS,
    ),
    PtxCheck(
        name="grouped_sm100",
        max_spill_bytes=24,
        harness=GROUPED_HARNESS,
        arch="sm_100a",
        required=(
            r"tcgen05\.mma\.cta_group::1\.kind::f16",
            r"tcgen05\.mma\.cta_group::2\.kind::f16",
            r"tcgen05\.alloc\.cta_group::1",
            r"tcgen05\.alloc\.cta_group::2",
            r"tcgen05\.dealloc\.cta_group::[12]",
            r"tcgen05\.ld\.sync\.aligned\.32x32b",
            r"tcgen05\.commit\.cta_group::1",
            r"tcgen05\.commit\.cta_group::2.*multicast",
            r"cp\.async\.bulk\.tensor\.2d\.cta_group::2",  # pair loads signal the leader
            r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier",
            r"\.reqnctapercluster 2, 1, 1",
        ),
        forbidden=NO_SPILLS,
    ),
    PtxCheck(
        name="moe_route_sm90",
        kernel_prefix="mojo_kernels_moe_route_kernels",
        max_spill_bytes=28,
        harness=MOE_ROUTE_HARNESS,
        arch="sm_90a",
        required=(
            r"ld\.global\.v4\.b32",  # 16-byte router weight / token loads
            r"match\.any\.sync\.b32",  # grouping: lanes of one expert
            r"shfl\.sync\.up",  # the table's prefix sum
        ),
        forbidden=NO_SPILLS,
    ),
)


def build_ptx(check: PtxCheck, out_dir: Path) -> list[Path]:
    """Builds the harness with --emit asm into out_dir and returns its .ptx files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / check.name
    cmd = [
        MOJO, "build", "-I", str(ROOT), "-I", str(ROOT / "tests" / "mojo"),
        "--target-accelerator", check.arch, "--emit", "asm",
        str(ROOT / check.harness), "-o", f"{stem}.s",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=MOJO_ENV)
    if run.returncode != 0:
        errors = [ln for ln in (run.stdout + run.stderr).splitlines() if "warning" not in ln]
        raise RuntimeError(f"{check.name}: mojo build failed:\n" + "\n".join(errors[-60:]))
    return sorted(out_dir.glob(f"{check.name}*.ptx"))


def evaluate(check: PtxCheck, ptx_files: list[Path]) -> list[str]:
    """The problems found (empty when the check passes)."""
    if not ptx_files:
        return ["no .ptx files were produced"]
    text = "\n".join(p.read_text(errors="replace") for p in ptx_files)
    problems = [f"missing /{pat}/" for pat in check.required if not re.search(pat, text)]
    for pat in check.forbidden:
        hits = [p.name for p in ptx_files if re.search(pat, p.read_text(errors="replace"))]
        if hits:
            problems.append(f"forbidden /{pat}/ in {', '.join(hits[:3])}")
    return problems


SPILLS = re.compile(r"(\d+) bytes spill stores")


def spill_problems(check: PtxCheck, ptx_files: list[Path]) -> list[str]:
    """The kernels `ptxas -v` reports with more spill stores than check.max_spill_bytes (none
    when the check sets no limit or ptxas is not on PATH)."""
    ptxas = shutil.which("ptxas")
    if check.max_spill_bytes is None or ptxas is None:
        return []
    problems = []
    for ptx in ptx_files:
        run = subprocess.run([ptxas, f"-arch={check.arch}", "-v", str(ptx), "-o", os.devnull],
                             capture_output=True, text=True)
        if run.returncode != 0:
            problems.append(f"ptxas failed on {ptx.name}: {run.stderr.strip()[-300:]}")
            continue
        worst = max((int(m) for m in SPILLS.findall(run.stderr)), default=0)
        if worst > check.max_spill_bytes:
            problems.append(f"{ptx.name}: {worst} bytes of spill stores (ptxas -v), more than "
                            f"the {check.max_spill_bytes} allowed")
    return problems


ENTRY = re.compile(r"^\.(?:visible )?\.entry (\w+)\(", re.MULTILINE)


def captured_checks(arch: str) -> list[PtxCheck]:
    """The checks a graph compile for `arch` covers (those with a kernel_prefix)."""
    return [c for c in CHECKS if c.arch == arch and c.kernel_prefix is not None]


REGISTERS = re.compile(r"Used (\d+) registers")


def captured_problems(check: PtxCheck, capture_dir: Path) -> tuple[list[str], str]:
    """`evaluate` and the spill limit over the captured kernels of `check` (scripts/ptxas-
    capture: one kernel per .ptx, its `ptxas -v` report in <name>.ptxas.log), and a summary:
    how many kernels, their most registers and spill stores."""
    assert check.kernel_prefix is not None
    mine = [p for p in sorted(capture_dir.glob("*.ptx"))
            if any(e.startswith(check.kernel_prefix)
                   for e in ENTRY.findall(p.read_text(errors="replace")))]
    if not mine:
        return [f"no captured kernel named {check.kernel_prefix}*"], "no kernels"
    problems = evaluate(check, mine)
    regs, spills = [0], [0]
    for ptx in mine:
        log = ptx.with_name(ptx.name + ".ptxas.log")
        report = log.read_text(errors="replace") if log.is_file() else ""
        if "spill stores" not in report:
            problems.append(f"{ptx.name}: no ptxas -v report")
            continue
        regs += [int(m) for m in REGISTERS.findall(report)]
        worst = max(int(m) for m in SPILLS.findall(report))
        spills.append(worst)
        if check.max_spill_bytes is not None and worst > check.max_spill_bytes:
            entry = ENTRY.findall(ptx.read_text(errors="replace"))[0]
            problems.append(f"{entry}: {worst} bytes of spill stores (ptxas -v), more than "
                            f"the {check.max_spill_bytes} allowed")
    kernels = f"{len(mine)} kernel{'s' if len(mine) != 1 else ''}"
    summary = (f"{kernels}, at most {max(regs)} registers and {max(spills)} bytes of spill "
               "stores per thread")
    return problems, summary


def check_captured(capture_dir: Path, arch: str) -> int:
    """Runs `captured_checks(arch)` on a capture; prints as `main` does, returns the number of
    failed checks."""
    failed = 0
    for check in captured_checks(arch):
        problems, summary = captured_problems(check, capture_dir)
        print(f"{'OK' if not problems else 'FAIL'} {check.name} ({arch}, graph compile: "
              f"{summary})", flush=True)
        for p in problems:
            print(f"    {p}")
        failed += bool(problems)
    print("all PTX checks passed" if not failed else f"{failed} PTX check(s) failed", flush=True)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="check names to run")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--keep", type=Path, default=None, help="keep the PTX in this folder")
    parser.add_argument("--captured", type=Path, default=None,
                        help="check a graph compile's captured PTX in this folder instead")
    parser.add_argument("--arch", default="sm_90a", help="the captured PTX's target")
    args = parser.parse_args()
    if args.captured is not None:
        return 1 if check_captured(args.captured, args.arch) else 0
    checks = [c for c in CHECKS if args.only is None or c.name in args.only]
    if args.list:
        for c in CHECKS:
            print(f"{c.name}: {c.harness} for {c.arch}: {len(c.required)} required, "
                  f"{len(c.forbidden)} forbidden")
        return 0
    if not checks:
        print(f"no such check; known: {', '.join(c.name for c in CHECKS)}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="check_ptx_"))
    failed = 0
    try:
        for check in checks:
            t0 = time.perf_counter()
            out_dir = (args.keep or tmp) / check.name
            try:
                ptx_files = build_ptx(check, out_dir)
                problems = evaluate(check, ptx_files) + spill_problems(check, ptx_files)
            except RuntimeError as err:
                problems = [str(err)]
            status = "OK" if not problems else "FAIL"
            print(f"{status} {check.name} ({check.arch}, {time.perf_counter() - t0:.1f}s)",
                  flush=True)
            for p in problems:
                print(f"    {p}")
            failed += bool(problems)
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("all PTX checks passed" if not failed else f"{failed} PTX check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
