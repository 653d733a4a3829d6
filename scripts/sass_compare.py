#!/usr/bin/env python3
"""sass_compare.py: is the machine code of CUDA units the same at two commits? For a refactor that must not change
what a kernel executes (a header reorganised, wrappers folded), on a machine with nvcc and no GPU or cuobjdump.

Each unit is compiled twice to a cubin with the build's own nvcc command (from ninja, `-c` made `-cubin`): from
the working tree, and from a copy of BASE's src/, include/ and tests/; then the executable sections
(.text.<kernel>) of the two ELF files are compared byte for byte. Line tables and symbol tables may differ (lines
moved); the instructions may not. Kernels in an anonymous namespace carry a per-unit number in their names, so
those are matched by content. Exit status 1 when a unit differs.

Usage (repo root, after `cmake --preset release`):
  python3 scripts/sass_compare.py --base 776f1f6 src/ops/cuda/fp8_gemm_sm90_n128.cu tests/cuda/test_cuda_wgmma.cu
  [--build build/release] [--jobs 2]"""
import argparse
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def text_sections(path):
    """{name: bytes} of an ELF64 file's .text.* sections."""
    b = open(path, "rb").read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        sys.exit(f"sass_compare.py: {path} is not an ELF64 file")
    (shoff,) = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names_at = hdr[shstrndx][4]

    def name(off):
        s = names_at + off
        return b[s:b.index(b"\0", s)].decode()

    return {name(h[0]): b[h[4]:h[4] + h[5]] for h in hdr if name(h[0]).startswith(".text.")}


def compile_command(build, src):
    """The build's nvcc command for SRC, made to write a cubin (output path appended by the caller)."""
    rel = os.path.relpath(os.path.abspath(src), ROOT)
    objs = subprocess.run(["ninja", "-C", build, "-t", "targets", "all"], capture_output=True, text=True,
                          check=True).stdout
    obj = next((line.split(":")[0] for line in objs.splitlines()
                if line.split(":")[0].endswith("/" + os.path.basename(rel) + ".o")), None)
    if obj is None:
        sys.exit(f"sass_compare.py: no object for {rel} in {build}")
    cmd = subprocess.run(["ninja", "-C", build, "-t", "commands", obj], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    args = shlex.split(cmd)
    if "ccache" in os.path.basename(args[0]):
        args = args[1:]
    out = []
    skip = 0
    for a in args:
        if skip:
            skip -= 1
        elif a in ("-MT", "-MF", "-o"):
            skip = 1
        elif a == "-MD":
            pass
        else:
            out.append("-cubin" if a == "-c" else a)
    return out


def build_cubin(args, build, tree, out):
    """ARGS with src/, include/ and tests/ read from TREE, run in the build folder as ninja would."""
    moved = [re.sub(re.escape(ROOT) + r"/(src|include|tests)\b", tree + r"/\1", a) for a in args]
    r = subprocess.run(moved + ["-o", out], capture_output=True, text=True, cwd=build)
    if r.returncode:
        sys.exit(f"sass_compare.py: compiling for {out} failed:\n{r.stderr[-2000:]}")


def compare(a, b):
    ta, tb = text_sections(a), text_sections(b)
    anon = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_")
    na = {anon.sub("_GLOBAL__N__", k): v for k, v in ta.items()}
    nb = {anon.sub("_GLOBAL__N__", k): v for k, v in tb.items()}
    same = na == nb or (len(ta) == len(tb) and sorted(ta.values()) == sorted(tb.values()))
    detail = [] if same else [f"  differs: {k[:140]}" for k in sorted(set(na) | set(nb)) if na.get(k) != nb.get(k)]
    return same, len(ta), sum(len(v) for v in ta.values()), detail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare the working tree against")
    ap.add_argument("--build", default="build/release", help="a configured CUDA build folder")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("units", nargs="+", help="CUDA sources (.cu) of the build")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    with tempfile.TemporaryDirectory(prefix="sass_compare.") as tmp:
        base = os.path.join(tmp, "base")
        os.makedirs(base)
        archive = subprocess.run(["git", "-C", ROOT, "archive", a.base, "src", "include", "tests"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        jobs = []
        for u in a.units:
            cmd = compile_command(a.build, u)
            n = os.path.basename(u)
            jobs += [(cmd, a.build, base, os.path.join(tmp, n + ".base.cubin")),
                     (cmd, a.build, ROOT, os.path.join(tmp, n + ".cubin"))]
        with ThreadPoolExecutor(a.jobs) as pool:
            list(pool.map(lambda j: build_cubin(*j), jobs))
        differ = 0
        for u in a.units:
            n = os.path.basename(u)
            base_cubin, cubin = os.path.join(tmp, n + ".base.cubin"), os.path.join(tmp, n + ".cubin")
            same, kernels, size, detail = compare(base_cubin, cubin)
            differ += not same
            print(f"{u}: {kernels} kernels, {size} bytes of code: {'identical' if same else 'DIFFERENT'} to {a.base}")
            for line in detail:
                print(line)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
