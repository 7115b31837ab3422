"""The launch constants every op family of PyCudaHandler shares, defined
once: the host plans grids with them, and the kernels get them from
``kernels/launch_constants.cuh``, which ``header_source`` writes (``python -m
handlers.generate``; a test fails while the header is out of date).
"""
import os

from .kernel_loader import KERNEL_DIR

#: Threads per block of the grid-stride kernels (elementwise, rows, reductions)
BLOCK = 256
#: Threads per block of the sums' mid kernels (``reductions.plan_mid`` says why)
MID_BLOCK = 1024
#: Loads in flight per thread in the sums' column kernels (reduce.cu)
SUM_UNROLL = 16
#: Loads in flight per thread in argmax_t's column kernels (reduce.cu): as
#: many as a sum's, now that a (value, index) state with a 32-bit index is
#: two registers (a 64-bit one held 8 loads: 4 registers a column)
PICK_UNROLL = 16
#: The longest rows (elements) that the row reductions give a group of
#: lanes each (reduce.cu's ``*_lanes``: as few lanes as hold the row, a
#: power of 2, at most 2 elements a lane) instead of a whole warp, whose
#: lanes a short row would leave idle
SHORT_ROW = 64
#: Row trips a lane group of ``*_lanes`` keeps in flight (every load issued
#: before any is added): 4 trips of one or two element loads (48-64
#: registers a thread, no spills; 8 trips took 73-116)
LANE_UNROLL = 4
#: The longest rows (elements) that the row reductions give a thread each
#: (reduce.cu's ``*_thread``): a warp's loads then cover 32 adjacent rows,
#: whose lines the lanes share, and no shared memory or barrier stands
#: between the loads and the sums (the ``*_short`` tiles ran rows of 3 to 8
#: floats at 38-44% of copy on an H200, a thread per row 101-104%:
#: benchmarks/results/diagnostics/reduction_variants.py)
THREAD_ROW = 8
#: Rows a thread of ``*_thread`` reduces, all their loads issued first
THREAD_UNROLL = 2
#: Rows per block of the kernels that give each row a warp (32 threads)
ROWS_PER_BLOCK = BLOCK // 32
#: Blocks per multiprocessor at most in a grid that strides over its work
MAX_BLOCKS_PER_SM = 16


#: The kernels' copy of these numbers (``header_source``)
HEADER = os.path.join(KERNEL_DIR, "launch_constants.cuh")


def header_source():
    """The text of ``kernels/launch_constants.cuh``: the launch constants
    above as the macros the kernels use (``SH_BLOCK``, ...).  ``python -m
    handlers.generate`` writes it."""
    values = {"SH_BLOCK": BLOCK, "SH_MID_BLOCK": MID_BLOCK, "SH_SUM_UNROLL": SUM_UNROLL,
              "SH_PICK_UNROLL": PICK_UNROLL, "SH_THREAD_ROW": THREAD_ROW,
              "SH_THREAD_UNROLL": THREAD_UNROLL, "SH_SHORT_ROW": SHORT_ROW,
              "SH_LANE_UNROLL": LANE_UNROLL,
              "SH_ROWS_PER_BLOCK": ROWS_PER_BLOCK, "SH_MAX_BLOCKS_PER_SM": MAX_BLOCKS_PER_SM}
    return "\n".join([
        "// The host's launch constants (BLOCK, MID_BLOCK, ... in",
        "// handlers/cuda/launch.py), by which the kernels size their shared",
        "// memory, launch bounds and loops.",
        "//",
        "// Written by `python -m handlers.generate`: do not edit by hand.",
        "#ifndef STREAMHANDLERS_KERNELS_LAUNCH_CONSTANTS_CUH",
        "#define STREAMHANDLERS_KERNELS_LAUNCH_CONSTANTS_CUH",
        "",
        *(f"#define {name} {value}" for name, value in values.items()),
        "",
        "#endif",
        ""])
