"""Kernel-source variants for ``row_occupancy.py --kernels NAME=DIR``: what
still separates our row kernels from the standalone ones of
``row_kernel_variants.py`` (softmax at 80% of copy where a standalone block
per row reached 94-98%, LayerNorm's forward at 73% against 95-97%).

Writes copies of this tree's ``handlers/cuda/kernels`` into OUT/<name>, each
with one textual change (checked to apply), and prints the ``--kernels``
arguments:

* ``nc``: packets loaded through the read-only path (``__ldg``: LDG.E.128
  .CONSTANT), which the standalone kernels' ``__restrict__`` pointers got
  and ours, whose outputs may be their inputs, do not.  Safe for the row
  kernels: each element is read before any write of it in the launch.
* ``p4``: streamed rows with four packets in flight a thread, not two.

Run on the GPU machine, from the project root::

    python benchmarks/results/diagnostics/row_variants.py /tmp/rv
    python benchmarks/results/diagnostics/row_occupancy.py \\
        --kernels nc=/tmp/rv/nc --kernels p4=/tmp/rv/p4

(``row_occupancy`` builds every kernel of its process from DIR, so a
variant must come from this tree.)  Each variant compiles here with nvcc
where one is installed (``--compile``).
"""
import argparse
import pathlib
import shutil
import subprocess

KERNELS = pathlib.Path(__file__).resolve().parents[3] / "handlers" / "cuda" / "kernels"

#: name -> [(file, old text, new text)]
VARIANTS = {
    "nc": [
        ("common.cuh", "const float4 v = reinterpret_cast<const float4*>(p)[i];",
         "const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);"),
        ("common.cuh", "const double2 v = reinterpret_cast<const double2*>(p)[i];",
         "const double2 v = __ldg(reinterpret_cast<const double2*>(p) + i);"),
        ("common.cuh", "return widen_packet<T>(reinterpret_cast<const uint4*>(p)[i]);",
         "return widen_packet<T>(__ldg(reinterpret_cast<const uint4*>(p) + i));"),
    ],
    "p4": [("fused.cuh", "constexpr int STREAM_PACKETS = 2;", "constexpr int STREAM_PACKETS = 4;")],
}


def write(out):
    """Write every variant under ``out``; returns {name: its directory}."""
    made = {}
    for name, edits in VARIANTS.items():
        dest = pathlib.Path(out) / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(KERNELS, dest)
        for file, old, new in edits:
            path = dest / file
            text = path.read_text()
            if text.count(old) != 1:
                raise SystemExit(f"variant {name}: {file} holds {old!r} "
                                 f"{text.count(old)} times, not once")
            path.write_text(text.replace(old, new))
        made[name] = dest
    return made


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the variants")
    p.add_argument("--compile", action="store_true",
                   help="compile each variant's fused.cuh users with nvcc (a syntax check)")
    a = p.parse_args()
    made = write(a.out)
    if a.compile:
        for name, d in made.items():
            for cu in ("reduce.cu", "elementwise.cu"):
                r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-I", str(d),
                                    str(d / cu), "-o", "/dev/null"], capture_output=True,
                                   text=True)
                print(f"{name}/{cu}: {'ok' if r.returncode == 0 else 'FAILED ' + r.stderr[-500:]}")
    print(" ".join(f"--kernels {n}={d}" for n, d in made.items()))


if __name__ == "__main__":
    main()
