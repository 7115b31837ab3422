"""CUDA source of a fused op (``handlers.fused.FusedOp``): one kernel per
declaration and dtype.

An op whose body reduces along the last axis, reads ``col`` or has per-row
(``:col``) arrays or summed (``:row``) outputs (``op.row_wise``) gets a row
kernel instead: :func:`row_kernel_source` says how it works and
:func:`plan_rows` how it is launched.  What follows is the elementwise
kernel; the row kernel shares its types, loads, stores, scalars and launch
format.

The kernel is a grid-stride loop over the outputs' elements (64-bit counts)
through ``sh::batched_loop`` of ``common.cuh``: each trip loads the element's
inputs, evaluates the program's statements in registers and returns the
outputs, and the loads of several trips are issued before their stores.
That is what makes an output that is an input's very memory safe (the trip
that writes an element has read it), and why the pointers are not
``__restrict__``: with an output allowed to be an input, the promise would be
false (elementwise.cu makes the same choice).  A row input is read at the
element's column, which a ``MixedRadix`` counter follows without a division.

Arrays are stored as ``T``: ``float``, ``double``, ``__nv_bfloat16`` or
``__half``.  All arithmetic is in the compute format, that of the NumPy
evaluation (``handlers.dtypes.compute_dtype``): the handler's precision for
float and double, where the source computes in ``T`` itself; ``float`` (named
``C``) for the half formats, which the NumPy handler evaluates on float32
copies and rounds once when it stores (``numpy_handler._widened``).  So for
the halves every value is widened with ``sh::ld`` as it is loaded (packets
widen in ``load_packet``), every statement is float math, and each output is
rounded once with ``sh::st<T>`` as it is stored (``store_packet`` rounds).
Constants are literals of the compute format, rounded as NumPy rounds them
(float32 literals for the halves); math goes through the ``dm::`` and
``fx::`` overloads (``expf`` for float).  Parameters, in the declaration's
order: ``const T*`` per array input, ``const T*`` and a number per scalar (a
device scalar's address or 0, and the number, of the compute format: ``T``
for float and double, ``C`` = float for the halves), ``T*`` per output, then
``long long n`` (elements) and ``long long cols`` (the outputs' last
dimension; a row kernel's are ``rows`` and ``cols``, followed, where the op
has summed ``:row`` outputs, by the workspace, the counters and the group
size of :func:`sum_groups`).  :func:`kernel_format` gives the same list as
launch codes.
"""
import functools
import math

import numpy as np

from .. import dtypes
from ..fused import OPERATIONS
from .launch import BLOCK

#: How each operation of a program is written in CUDA ({0}, {1}, ... its
#: operands, already parenthesised where needed; {C} the name of the compute
#: format in the source).  Must cover OPERATIONS.
CUDA = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "fx::mul({0}, {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "pow": "dm::pow({0}, {1})",
    # comparisons give 1 or 0; every comparison with NaN is false (!= true)
    "lt": "({0} < {1} ? {C}(1) : {C}(0))", "le": "({0} <= {1} ? {C}(1) : {C}(0))",
    "gt": "({0} > {1} ? {C}(1) : {C}(0))", "ge": "({0} >= {1} ? {C}(1) : {C}(0))",
    "eq": "({0} == {1} ? {C}(1) : {C}(0))", "ne": "({0} != {1} ? {C}(1) : {C}(0))",
    # a condition is true where it is not 0 (NaN is true, as in where_t)
    "and": "({0} != {C}(0) && {1} != {C}(0) ? {C}(1) : {C}(0))",
    "or": "({0} != {C}(0) || {1} != {C}(0) ? {C}(1) : {C}(0))",
    "not": "({0} == {C}(0) ? {C}(1) : {C}(0))",
    "where": "({0} != {C}(0) ? {1} : {2})",
    "max": "fx::max({0}, {1})", "min": "fx::min({0}, {1})",
    "exp": "dm::exp({0})", "expm1": "dm::expm1({0})", "log": "dm::log({0})",
    "log1p": "fx::log1p({0})", "sqrt": "dm::sqrt({0})", "rsqrt": "dm::rsqrt({0})",
    "tanh": "dm::tanh({0})", "abs": "dm::abs({0})", "sigmoid": "fx::sigmoid({0})",
    "erf": "fx::erf({0})", "ipow": "fx::ipow<{k}>({0})",
}
assert set(CUDA) == OPERATIONS, set(CUDA) ^ OPERATIONS

#: Per kernel suffix (``dtypes.short_name``): the C storage type, the C
#: compute type and the launch code of a number of the compute type.
_CTYPE = {"f32": ("float", "float", "f"), "f64": ("double", "double", "d"),
          "bf16": ("__nv_bfloat16", "float", "f"), "f16": ("__half", "float", "f")}


def _ctype(dtype):
    return _CTYPE[dtypes.short_name(dtype)]


def _compute_name(dtype):
    """The compute format's name in the source: ``T`` where it is the storage
    format (float, double), ``C`` for the halves."""
    return "C" if dtypes.is_half(dtype) else "T"


def kernel_name(op, dtype, formats=None):
    """The kernel's name: the op's name, its declaration's hash and the dtype
    (``f32``, ``f64``, ``bf16``, ``f16``), then each array of another format
    (``formats``: its name and dtype; see :func:`array_formats`)."""
    name = f"fused_{op.name}_{op.digest}_{dtypes.short_name(dtype)}"
    return name + "".join(f"_{p}_{dtypes.short_name(d)}" for p, d in (formats or {}).items())


def array_formats(op, dtype, args):
    """``{parameter: dtype}`` of ``op``'s arrays declared of any format
    (``^``) whose arrays in ``args`` (parameter order) are not of the
    handler's ``dtype``: the kernel's specialization, empty for most calls
    (then the kernel is the plain one of ``dtype``)."""
    if not op.any_format:
        return {}
    return {p: a.dtype for p, a in zip(op.params, args)
            if p in op.any_format and a.dtype != dtype}


def _array_type(p, formats):
    """An array parameter's element type in the source: ``T`` (the
    handler's format), or ``A_<p>`` for one of another format."""
    return f"A_{p}" if p in formats else "T"


def _other(ptr, formats):
    """Whether pointer ``ptr`` (``in_<p>`` or ``out_<p>``) is an array of
    another format (``formats``)."""
    return ptr.split("_", 1)[1] in formats


def _load(c, widen, formats, ptr, index):
    """The expression loading element ``index`` of pointer ``ptr`` (``in_<p>``
    or ``out_<p>``) in compute format ``c``."""
    if _other(ptr, formats):
        return f"{c}(ld({ptr}[{index}]))"
    return widen.format(f"{ptr}[{index}]")


def _load_packet(formats, var, ptr, index):
    """The line loading packet ``index`` of ``ptr`` into ``var``: W elements
    in the compute format (``load_lanes`` for an array of another format)."""
    if _other(ptr, formats):
        return f"const auto {var} = load_lanes<W>({ptr}, {index});"
    return f"const Packet<T> {var} = load_packet({ptr}, {index});"


def _store_packet(c, formats, o, index, values):
    """The statement storing output ``o`` of the W results ``values``
    (``Lanes`` of ``Values``) as packet ``index`` of ``out_<o>``."""
    lanes, store = (f"Lanes<{c}, W>", "store_lanes<W>") if o in formats \
        else ("Packet<T>", "store_packet")
    return (f"{{ {lanes} pk; for (int k = 0; k < W; ++k) pk.v[k] = {values}.v[k].{o}; "
            f"{store}(out_{o}, {index}, pk); }}")


def _store(store, formats, o, value):
    """The expression converting ``value`` for output ``o``'s memory."""
    return f"st<A_{o}>({value})" if o in formats else store.format(value)


def _aligned(ptr, formats):
    """The test that ``ptr`` moves by packets: 16 bytes, or for an array of
    another format its N = W elements (``load_lanes``)."""
    if _other(ptr, formats):
        return f"is_aligned_to({ptr}, W * sizeof(A_{ptr.split('_', 1)[1]}))"
    return f"is_aligned16({ptr})"


def kernel_format(op, dtype):
    """The launch format (struct codes of ``handlers/cuda/_launch.c``): ``P``
    per array, ``P`` and the compute format's code per scalar (``f`` for
    float32 and the halves, ``d`` for float64), then ``qq``, then ``PPq``
    with summed outputs (workspace, counters, group)."""
    code = _ctype(dtype)[2]
    return ("".join("P" + code if p in op.scalars else "P" for p in op.params) + "qq"
            + ("PPq" if op.sums else ""))


def literal(value, dtype):
    """``value`` as a CUDA literal of ``dtype``'s compute format, rounded as
    NumPy rounds it (a float32 literal for the halves: the NumPy handler
    evaluates them in float32, so a constant is rounded to float32, never to
    the half format)."""
    c = _compute_name(dtype)
    dtype = dtypes.compute_dtype(dtype)
    # Round first: a constant beyond float32's range (1e300) is infinite there.
    with np.errstate(over="ignore"):
        value = float(np.dtype(dtype).type(value))
    if np.isnan(value):
        return f"dm::quiet_nan<{c}>()"
    if np.isinf(value):
        return f"dm::infinity<{c}>()" if value > 0 else f"(-dm::infinity<{c}>())"
    if np.dtype(dtype) == np.float32:
        # The shortest decimal of the float32 value, read back exactly by nvcc.
        return repr(float(np.float32(value))) + "f"
    return repr(value)


def _cname(slot):
    """The C name of a program slot (user names are prefixed, so they never
    meet a C keyword or a name of the kernel's own)."""
    kind, name = slot.split(":")
    return {"in": "v_", "sc": "s_", "old": "o_"}.get(kind, kind + "_") + name


def _expr(e, dtype, reductions=None):
    """The C expression of program expression ``e``; ``reductions`` maps each
    reduction of a row kernel to the name of its per-row value."""
    kind = e[0]
    if kind == "num":
        return literal(e[1], dtype)
    if kind == "ref":
        return _cname(e[1])
    if kind == "col":
        return "j_col"
    if kind == "reduce":
        return reductions[e]
    if kind == "ipow":
        return CUDA["ipow"].format(_expr(e[1], dtype, reductions), k=e[2])
    return CUDA[kind].format(*(_expr(a, dtype, reductions) for a in e[1:]),
                             C=_compute_name(dtype))


def _preamble(op, dtype, block, params, row=False, formats=None):
    """The lines every generated kernel begins with: what it is (a row
    kernel with ``row``), the declaration's body as comments, the formats T
    (storage) and C (arithmetic), ``A_<p>`` for each array of another format
    (``formats``), the signature of ``params`` and ``W``, the elements of a
    16-byte packet of T."""
    ctype, cctype, _ = _ctype(dtype)
    if dtypes.is_half(dtype):
        title = f"{ctype} stored, {cctype} math rounded once on store"
        types = f"namespace {{ using T = {ctype}; using C = {cctype}; }}"
    else:
        title = ctype
        types = f"namespace {{ using T = {ctype};{' using C = T;' if row else ''} }}"
    for p, d in (formats or {}).items():
        types += f"\nnamespace {{ using A_{p} = {_ctype(d)[0]}; }}"
        title += f", {p} {_ctype(d)[0]}"
    what = (["a row kernel generated by", "// handlers/cuda/fused_source.py:"] if row
            else ["generated by handlers/cuda/fused_source.py:"])
    return [
        f'// Fused op "{op.name}" ({title}), {what[0]}', *what[1:],
        "\n".join(f"    // {line}" for line in op.program.text.split("; ")),
        '#include "fused.cuh"',
        "",
        types,
        "",
        *([f"template <int STRATEGY> __device__ __forceinline__ void "
           f"{kernel_name(op, dtype, formats)}_body("] if row else
          [f'extern "C" __global__ void __launch_bounds__({block}) '
           f'{kernel_name(op, dtype, formats)}(']),
        "        " + ", ".join(params) + ") {",
        "    using namespace sh;",
        "    constexpr int W = kVec<T>;",
    ]


def _scalars(op, dtype):
    """The kernel lines that read each scalar: from its device pointer when
    one is given, else its value argument (widened for the halves)."""
    if dtypes.is_half(dtype):
        scalar = "const C s_{0} = sp_{0} ? ld(*sp_{0}) : sv_{0};"
    else:
        scalar = "const T s_{0} = sp_{0} ? *sp_{0} : sv_{0};"
    return ["    " + scalar.format(name) for name in op.scalars]


def kernel_source(op, dtype, block, formats=None):
    """The CUDA source of ``op``'s kernel for ``dtype``, launched with
    ``block`` threads per block at most (its ``__launch_bounds__``): the
    host's BLOCK for an elementwise op, :data:`ROW_BLOCK` for a row kernel
    (``op.row_wise``: see :func:`row_kernel_source`).  ``formats``
    (:func:`array_formats`) gives the arrays of another format than
    ``dtype``'s, each loaded and stored in its own."""
    formats = formats or {}
    if op.row_wise:
        return row_kernel_source(op, dtype, block, formats)
    half = dtypes.is_half(dtype)
    c = _compute_name(dtype)   # values in registers: T, or C for the halves
    # A half is widened as it is loaded and rounded once as it is stored.
    widen = "ld({})" if half else "{}"
    prog = op.program
    params, arrays = [], []   # kernel parameters; (pointer, f's argument, row?) read
    for p in op.params:
        if p in op.scalars:
            params += [f"const T* sp_{p}", f"{c} sv_{p}"]
        elif p in op.outputs:
            params.append(f"{_array_type(p, formats)}* out_{p}")
            if p in prog.reads_old:
                arrays.append(("out_" + p, "o_" + p, False))
        else:
            params.append(f"const {_array_type(p, formats)}* in_{p}")
            arrays.append(("in_" + p, "v_" + p, p in op.rows))
    params += ["long long n", "long long cols"]
    pointers = [f"in_{p}" for p in op.params if p not in op.scalars and p not in op.outputs]
    pointers += [f"out_{o}" for o in op.outputs]
    rows = bool(op.rows)
    counter = "MixedRadix" if rows else "NoCounter"
    # Packet trips per batch of batched_loop: about 128 bytes of loads in
    # flight per thread, and at least one trip (an LSTM step reads 13 arrays).
    trips = max(1, 8 // max(1, len(arrays)))
    # At most kVec<T> trips for float and double, 4 for the halves: the same
    # bytes in flight as float (4 trips of 16-byte packets per array), with
    # twice its registers for the held results (8 lanes a packet).
    batch = f"({trips} < kVec<T> ? {trips} : kVec<T>)" if not half else str(min(trips, 4))

    def loads(index, row_index):
        return ", ".join(_load(c, widen, formats, ptr, row_index if row else index)
                         for ptr, _, row in arrays)

    f_body = [f"const {c} {_cname(slot)} = {_expr(expr, dtype)};"
              for slot, expr in prog.statements]
    f_body += ["Values r;", *[f"r.{o} = {_cname(prog.results[o])};" for o in op.outputs],
               "return r;"]
    store = " ".join(f"out_{o}[e] = {_store('st<T>({})' if half else '{}', formats, o, f'r.{o}')};"
                     for o in op.outputs)
    store_packets = " ".join(_store_packet(c, formats, o, "p", "r") for o in op.outputs)
    packet_loads = [_load_packet(formats, f"{ptr}_p", ptr, "c.d0" if row else "p")
                    for ptr, _, row in arrays]
    lines = [
        *_preamble(op, dtype, block, params, formats=formats),
        *_scalars(op, dtype),
        "    struct Values { " + " ".join(f"{c} {o};" for o in op.outputs) + " };",
        "    // The body, on one element's inputs (and old outputs where it reads them).",
        "    const auto f = [&](" + ", ".join(f"const {c} {name}" for _, name, _ in arrays)
        + ") -> Values {",
        *[f"        {line}" for line in f_body],
        "    };",
        # Packets when every array is 16-byte aligned and (with a row input)
        # a packet never straddles two rows; the bulk then moves in 16-byte
        # accesses, as elementwise.cu's ops do.
        "    const bool aligned = " + " && ".join(_aligned(q, formats) for q in pointers)
        + (" && cols % W == 0;" if rows else ";"),
        "    if (aligned) {",
        "        const long long npk = n / W;",
        # d0 = the packet's column among the row's cols / W packets.
        f"        {counter} at{'(grid_thread(), grid_stride(), cols / W, 1)' if rows else ''};",
        f"        batched_loop<{batch}>(",
        "            0, npk, at,",
        f"            [&](long long p, const {counter}& c) {{",
        "                (void)c;",
        *[f"                {line}" for line in packet_loads],
        "                Lanes<Values, W> r;",
        "#pragma unroll",
        "                for (int k = 0; k < W; ++k) r.v[k] = f("
        + ", ".join(f"{ptr}_p.v[k]" for ptr, _, _ in arrays) + ");",
        "                return r;",
        "            },",
        f"            [&](long long p, const Lanes<Values, W>& r) {{ {store_packets} }});",
        "        // The last n % W elements (never with a row input: cols % W == 0).",
        "        for (long long e = npk * W + grid_thread(); e < n; e += grid_stride()) {",
        f"            const Values r = f({loads('e', 'e % cols')});",
        f"            {store}",
        "        }",
        "        return;",
        "    }",
        # d0 = the column of the element (rows of cols elements; radix1 = 1
        # leaves the row count in d2, unused).
        f"    {counter} at{'(grid_thread(), grid_stride(), cols, 1)' if rows else ''};",
        "    (void)cols;",
        "    batched_loop<kVec<T>>(",
        "        0, n, at,",
        f"        [&](long long e, const {counter}& c) {{",
        "            (void)c;",
        f"            return f({loads('e', 'c.d0')});",
        "        },",
        f"        [&](long long e, const Values& r) {{ {store} }});",
        "}",
        "",
    ]
    return "\n".join(lines)


# ============================================================================ row kernels
#: Threads per block of a row kernel at most (its ``__launch_bounds__``): a
#: row of up to ROW_BLOCK * R elements is held by one block.
ROW_BLOCK = 1024
#: Values of a row one thread holds in registers, over the arrays it reads
#: per element, by compute format: 16 floats or 4 doubles (16 and 8 of the 64
#: registers that ``__launch_bounds__(ROW_BLOCK)`` leaves a thread), so that
#: the body's temporaries fit: nvcc 13 spills little or nothing for softmax,
#: cross-entropy and LayerNorm at these budgets (double math takes many more
#: registers than float: cross-entropy spilled 164 bytes at 8 doubles).
HELD_VALUES = {"float": 16, "double": 4}
#: The most elements of a row one thread holds in a block's row (a half
#: format: at least its packet of 8, whatever the budget).  16, not 8: a
#: multiprocessor's resident rows then keep more bytes in flight, which
#: outweighs the registers they take (on an H200, float32 over 8192x4096:
#: softmax 78.2 us holding 8, 75.0 holding 16; cross-entropy with its
#: gradient 117.1 and 96.8; LayerNorm's forward 82.3 and 78.8;
#: diagnostics/held_counts).
HELD_MOST = 16
#: The most a lane group's thread holds (:func:`lane_held`): a lane row's
#: kernel, which many rows share a block of, recomputes rather than keeps,
#: and at 16 cross-entropy's spilled 140 bytes (nvcc 13, sm_90).
LANE_HELD_MOST = 8


def _element_arrays(op):
    """The arrays a row kernel reads per element, in parameter order, as
    (pointer, program slot, row input?): full inputs, ``:row`` inputs and
    full outputs whose old contents the body reads."""
    out = []
    for p in op.params:
        if p in op.scalars or p in op.cols:
            continue
        if p in op.outputs:
            if p in op.program.reads_old:
                out.append(("out_" + p, "old:" + p, False))
        else:
            out.append(("in_" + p, "in:" + p, p in op.rows))
    return out


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of a row op
def held_elements(op, dtype):
    """R, the elements of a row each thread holds in registers in a block's
    row (at most :data:`HELD_MOST`; fewer when the body reads several
    full arrays per element or sums outputs over the rows, within
    :data:`HELD_VALUES`, rounded down to
    whole 16-byte packets where that leaves at least one; a half format's
    whole packet, 8, always); a lane group's thread holds
    ``lane_held(R)``.  ``:row`` inputs
    take no share of the budget: a thread holds them beside the rest only
    where they take few registers (:func:`holds_row_inputs`), else the
    kernel reads them where the body uses them (the same few columns for
    every row, from cache)."""
    budget = HELD_VALUES[_ctype(dtype)[1]]
    # Each held element takes a register per full array read and one per
    # summed output (its column's running sum).
    arrays = sum(1 for _, _, is_row in _element_arrays(op) if not is_row) + len(op.sums)
    held = max(1, min(HELD_MOST, budget // max(1, arrays)))
    # A multiple of the 16-byte packet's elements where it holds one: then
    # the kernel loads and stores the row by packets.  A half format holds
    # its whole packet of 8 past the budget: element by element, 2 bytes a
    # load, cost more than the registers (on an H200 the bfloat16 bias-and-
    # ReLU backward over 4096x4096 took 88.7 us holding 5, 62.5 holding 8;
    # diagnostics/half_rows_held).
    width = 16 // np.dtype(dtype).itemsize
    if dtypes.is_half(dtype):
        return max(width, held - held % width)
    return held - held % width if held >= width else held


#: The registers a thread's held ``:row`` inputs may take (their count times
#: its held elements; :func:`holds_row_inputs`).  Held, a row input comes by
#: packets with the row's other arrays, once a pass; read at use, it costs a
#: scalar load per element in each pass (behind a test of the slot), which
#: is where LayerNorm's backward, one row input over 4 elements a thread,
#: lost time against a standalone kernel of its structure
#: (diagnostics/summed_rows_pipeline).  A few: LayerNorm's forward, two row
#: inputs over 16 elements, would hold 32 more values a thread.
ROW_INPUT_REGISTERS = 4


#: Values of a trip's rows one thread holds in a block looping over rows (an
#: op with summed outputs), by compute format, at most :data:`TRIP_MOST`
#: rows (:func:`trip_rows`).  nvcc 13 (sm_90) compiles every summed op of
#: tests/test_fused_reduce.py within 64 registers, no spill, on these; four
#: rows a trip, or two in the kernel that tests each slot, spilled.
TRIP_VALUES = {"float": 24, "double": 6}
TRIP_MOST = 2


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of a row op
def trip_rows(op, dtype):
    """The rows a trip of a block holding rows in every slot (the ``full``
    kernel) takes in a row kernel with summed outputs (1 without, and in
    a half format, which holds its packet of 8 past the budget already):
    as many as keep the values a thread holds for them
    (:func:`held_elements` times the arrays it holds, held ``:row`` inputs
    included) within :data:`TRIP_VALUES`, at most :data:`TRIP_MOST`.
    Their loads go out together, so that a multiprocessor's one block keeps
    several rows' bytes in flight."""
    if not op.sums or dtypes.is_half(dtype):
        return 1
    hold = holds_row_inputs(op, dtype)
    arrays = sum(1 for _, _, is_row in _element_arrays(op) if not is_row or hold)
    per_row = held_elements(op, dtype) * max(1, arrays)
    return max(1, min(TRIP_MOST, TRIP_VALUES[_ctype(dtype)[1]] // per_row))


#: The rows a block streaming rows with summed outputs takes a batch
#: (``fx::stream_rows_sums`` in kernels/fused.cuh), by compute format:
#: their reductions first, each row's per-row values kept, then one walk
#: over the columns in which a thread loads the batch's elements of a
#: column together and adds their terms in registers before one read and
#: write of its block's partial row.  A row at a time, that partial row was
#: read and written for every row, in memory: LayerNorm's backward over
#: 4096x50257 on an H200 took 3679 us, dx alone 1062
#: (diagnostics/fused_terms).  The most rows whose loads fit a 1024-thread
#: block's 64 registers: LayerNorm's backward spilled 92 bytes at four rows
#: of float32 and 182 at three of float64 (nvcc 13, sm_90).
STREAM_BATCH = {"float": 3, "double": 2}


def stream_batch(op, dtype):
    """The rows a batch that a block streaming ``op``'s rows in ``dtype``
    takes (:data:`STREAM_BATCH`) for an op with summed outputs and no
    per-row output (whose store a batch's walk would reorder); else 1 (a
    row at a time)."""
    if not op.sums or any(o in op.cols for o in op.outputs):
        return 1
    return STREAM_BATCH[_ctype(dtype)[1]]


def holds_row_inputs(op, dtype):
    """Whether a row kernel of ``op`` holds its ``:row`` inputs with the
    elements (loaded with them, fields of ``In``): where their count times
    the elements a thread holds (:func:`held_elements`) is at most
    :data:`ROW_INPUT_REGISTERS`."""
    rows = sum(1 for _, _, is_row in _element_arrays(op) if is_row)
    return 0 < rows * held_elements(op, dtype) <= ROW_INPUT_REGISTERS


def _lane_or_default(held, lane):
    """``lane``, the elements a lane group's thread holds, or where None the
    default for ``held`` elements a thread of a block: ``lane_held(held)``."""
    return lane_held(held) if lane is None else lane


def lane_held(held):
    """The elements a lane group's thread holds where a block's thread holds
    ``held`` (:func:`held_elements`): at most :data:`LANE_HELD_MOST`, a
    whole number of packets as ``held`` is."""
    return min(held, LANE_HELD_MOST)


#: The elements a lane group's thread holds in a row kernel with summed
#: outputs in a half format: two packets of 8.  Such a row of up to 512
#: columns is then a warp's, 8 rows a block of 256 (a block per row of 64
#: threads before: LayerNorm's backward over 8192 x 512 in bfloat16 ran
#: under 6 warps a multiprocessor, and its 64-thread finishing block read
#: the partial rows at about 8 KB/us), in a kernel of its own launch bounds
#: (BLOCK: nvcc 13 gives LayerNorm's backward 128 registers, no spill).
LANE_SUMMED_HALF = 16


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of a row op
def lane_elements(op, dtype):
    """The elements a lane group's thread holds in ``op``'s row kernel for
    ``dtype``: :data:`LANE_SUMMED_HALF` for summed outputs in a half
    format, else ``lane_held(held_elements(op, dtype))``."""
    if op.sums and dtypes.is_half(dtype):
        return LANE_SUMMED_HALF
    return lane_held(held_elements(op, dtype))


#: The most bytes of partial rows a launch with summed (``:row``) outputs
#: keeps in its stream's workspace (``plan_rows`` caps its grid by it).
SUM_WORKSPACE = 64 << 20


#: How a row kernel with summed outputs spreads its rows past a block a
#: multiprocessor: each block takes rows / grid rows one after another, and
#: adds a partial row of cols values that the launch's combine then reads,
#: so time goes as a * rows / grid + b * grid * cols, least at a grid
#: proportional to sqrt(rows / cols): about sms * sqrt(rows / (SUM_SPREAD *
#: cols)) blocks.  On an H200 this gave the fastest grid tried, or one
#: within 3%, for LayerNorm's backward over 8192x4096, 32768x1000, 4096x256
#: and 1024x50257 in float32 and the large ones in bfloat16, and for the
#: dense layer's bias-and-ReLU backward over 4096x4096 (bfloat16: 52.0 us
#: on its 132 blocks, 62.9 on the 256 of the rule before, 16 rows a
#: block at least) (benchmarks/results/diagnostics/summed_rows_grid*).
SUM_SPREAD = 2


#: The row kernels' strategies, one kernel each (``rows_impl`` in
#: kernels/fused.cuh): lane groups, a block holding the row, a block
#: streaming it, a block holding the row in every slot.
STRATEGIES = ("lane", "block", "stream", "full")


def strategy(cols, held, block, lane=None):
    """The strategy (an index into :data:`STRATEGIES`) of a row kernel over
    rows of ``cols`` elements, ``held`` per thread of a block
    (:func:`held_elements`), in blocks of ``block`` threads
    (``plan_rows``'s): lane groups up to 32 * ``lane`` columns (a lane's
    elements, :func:`lane_elements`; None: lane_held(held)), a
    block holding the row up to block * held (``full`` at exactly block *
    held: no slot past the row, so no test of one), else streaming."""
    if cols <= 32 * _lane_or_default(held, lane):
        return 0
    if cols == block * held:
        return 3
    return 1 if cols < block * held else 2


def row_block(cols, held, lane=None):
    """The block of a row kernel over rows of ``cols`` elements, ``held`` per
    thread of a block, ``lane`` per lane of a lane group (:func:`plan_rows`'s)."""
    if cols <= 32 * _lane_or_default(held, lane):
        return BLOCK
    return min(ROW_BLOCK, -(-cols // (32 * held)) * 32)


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of a row op
def plan_rows(rows, cols, held, sms, sm_threads, sum_bytes=0, l2_bytes=0, per_sm=None,
              trip=1, lane=None, batch=1):
    """(grid, block) of a row kernel (:func:`row_kernel_source`) over ``rows``
    rows of ``cols`` elements, ``held`` elements per thread of a block
    (:func:`held_elements`), on a GPU of ``sms`` multiprocessors holding
    ``sm_threads`` threads each; grid 0 when there is no row.  ``sum_bytes``
    (:func:`sum_bytes`), nonzero for an op with summed outputs, gives at
    least one block (which writes zeros over no rows) and at most as many as
    keep the blocks' partial rows (``sum_bytes * cols`` bytes each) within
    :data:`SUM_WORKSPACE` (fewer blocks only for rows of megabytes), and at
    most the blocks resident at once: ``per_sm`` a multiprocessor, the
    compiled kernel's occupancy (its registers may allow fewer than the
    threads do; None: ``sm_threads // block``), and past ``sms`` blocks
    about sms * sqrt(rows / (SUM_SPREAD * cols)) (:data:`SUM_SPREAD`); a
    block holding rows in every slot then takes ``trip`` rows a trip
    (:func:`trip_rows`), so at most one block per trip, and a block
    streaming rows ``batch`` rows a batch (:func:`stream_batch`), at most
    one block per batch.  ``lane``: the elements a lane group's thread
    holds (:func:`lane_elements`; None: lane_held(held)).

    The strategy follows from cols and the block (:func:`strategy`, which
    picks the kernel): rows of up to 32 * lane_held(held)
    go to lane groups in blocks of BLOCK threads (block / width rows a block,
    width the group's lanes, each holding lane_held(held)); a longer row
    gets a block of its own, of as few threads as hold it (a multiple of
    32, at most ROW_BLOCK, which then streams rows longer than ROW_BLOCK *
    held): every thread then holds
    ``held`` elements, the most loads in flight a thread can have.

    The grid: a block for every row group, as the hardware's block
    scheduler then starts a block's loads while other blocks on the
    multiprocessor finish theirs (a softmax on an H200 ran 5-15% faster so
    than with a resident grid striding over the rows), and the block and
    streamed kernels then keep no loop (ValueError past 2**31 - 1 rows, a
    grid's limit, which rows longer than a lane group's cannot reach in any
    GPU's memory); with summed outputs, at most the resident blocks, as
    each block adds a partial row to combine.
    A streamed row (longer than ROW_BLOCK * held) adds its terms into its
    block's partial row in memory, reading and writing it once per row (once
    per batch of ``batch`` rows, which add their terms in registers first): the
    grid then keeps the partial rows within half of ``l2_bytes`` (the GPU's
    L2 cache; 0: unknown, no such limit), so that this traffic stays in L2,
    but keeps a block a multiprocessor (LayerNorm's backward over 1024x50257
    on an H200: 1398 us on the 78 blocks within L2, 1177 us on 132).
    """
    lane = _lane_or_default(held, lane)
    block = row_block(cols, held, lane)
    if cols <= 32 * lane:
        width = 1
        while width * lane < cols:
            width *= 2
        needed = -(-rows // (block // width))
    else:
        # only a full block with summed outputs loops over rows by trips,
        # and a streaming one by batches
        way = STRATEGIES[strategy(cols, held, block, lane)]
        per_block = {"full": trip, "stream": batch}.get(way, 1) if sum_bytes else 1
        needed = -(-rows // per_block)
        if rows > 2**31 - 1 and not sum_bytes:
            raise ValueError(f"a row kernel takes at most 2**31 - 1 rows of {cols} "
                             f"elements, got {rows}")
    grid = min(needed, 2**31 - 1)
    if sum_bytes:
        row_bytes = sum_bytes * max(1, cols)
        resident = sms * (max(1, sm_threads // block) if per_sm is None else per_sm)
        # Each block's partial row is written and combined: past one block
        # a multiprocessor, weigh that against the rows a block takes in turn.
        spread = round(sms * math.sqrt(rows / (SUM_SPREAD * max(1, cols))))
        grid = min(grid, resident, max(sms, spread))
        if l2_bytes and cols > ROW_BLOCK * held:
            grid = min(grid, max(sms, l2_bytes // 2 // row_bytes))
        grid = max(1, min(grid, SUM_WORKSPACE // row_bytes))
    return grid, block


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of a row op
def sum_bytes(op, dtype):
    """Bytes of one column of a block's partial row in a row kernel with
    summed (``:row``) outputs: one compute-format value per summed output
    (float for float32 and the halves, double for float64); 0 without."""
    return len(op.sums) * np.dtype(dtypes.compute_dtype(dtype)).itemsize


def sum_groups(grid):
    """(group, counters) of the in-launch combine of a row kernel's partial
    rows (``finish_sums`` in kernels/fused.cuh): blocks per first-level
    group, about the square root of ``grid`` so that no block adds more
    than that many rows, and the per-stream counters it needs (one per
    group and one for the groups)."""
    group = max(1, math.isqrt(max(0, grid - 1)) + 1)
    return group, -(-grid // group) + 1


def _operands(e):
    """The sub-expressions of expression ``e`` that its walks enter: none of
    a number, ``col``, a reference or a reduction (a reduction's argument is
    walked where the reduction is), else its arguments."""
    kind = e[0]
    if kind in ("num", "col", "ref", "reduce"):
        return ()
    return (e[1],) if kind == "ipow" else e[1:]


def _levels(prog):
    """(slot -> its level, reductions -> their level): a reduction's level is
    one more than the deepest reduction its argument depends on, a value's
    level that of the deepest reduction it depends on (0 for none).  The
    reductions come in the order they are first met, inner ones first."""
    depth, found = {}, {}

    def level(e):
        if e[0] == "ref":
            return depth.get(e[1], 0)
        if e[0] == "reduce":
            lv = 1 + level(e[2])
            found.setdefault(e, lv)
            return lv
        return max((level(a) for a in _operands(e)), default=0)
    for slot, expr in prog.statements:
        depth[slot] = level(expr)
    return depth, found


def _element_slice(prog, roots):
    """What a per-element lambda computes for the expressions ``roots``: the
    statements of per-element values they need (in program order), and the
    leaves they read (element array slots, ``"col"``).  Per-row values and
    reductions are variables of the row's scope, captured."""
    stmts = dict(prog.statements)
    need, leaves, stack = set(), set(), list(roots)
    while stack:
        e = stack.pop()
        if e[0] == "col":
            leaves.add("col")
        elif e[0] == "ref":
            slot = e[1]
            if slot in prog.per_row or slot in need:
                continue
            if slot in stmts:
                need.add(slot)
                stack.append(stmts[slot])
            else:
                leaves.add(slot)
        stack.extend(_operands(e))
    return [(slot, expr) for slot, expr in prog.statements if slot in need], leaves


class _RowContext:
    """What the parts of a row kernel's source share: the op, its format's
    names and conversions, its program's levels and reductions (each named
    ``rd<i>`` in the source) and the arrays read per element."""

    def __init__(self, op, dtype, formats):
        self.op, self.dtype, self.prog = op, dtype, op.program
        self.formats = formats   # arrays of another format (array_formats)
        self.c = _compute_name(dtype)   # the compute format: T, or C for the halves
        half = dtypes.is_half(dtype)
        self.widen = "ld({})" if half else "{}"
        self.store = "st<T>({})" if half else "{}"
        self.depth, self.found = _levels(self.prog)
        self.reductions = {e: f"rd{i}" for i, e in enumerate(self.found)}
        # The arrays held per element (In; row inputs too where they fit and
        # are of the handler's format), and the row inputs read at use.
        hold = holds_row_inputs(op, dtype)
        self.elements = [e for e in _element_arrays(op)
                         if not e[2] or hold and not _other(e[0], formats)]
        self.row_inputs = [(ptr, slot) for ptr, slot, is_row in _element_arrays(op)
                           if is_row and (ptr, slot, is_row) not in self.elements]
        self.full_outs = [o for o in op.outputs if o not in op.cols + op.sums]
        self.row_outs = [o for o in op.outputs if o in op.cols]
        self.sums = list(op.sums)   # summed (':row') outputs, Values::sums[i] in order
        self.leader_only = self._leader_only()

    def _leader_only(self):
        """The per-row values that only per-row outputs need (no reduction's
        argument, full or summed output): the row's leader computes them,
        after the outputs' pass, where they hold no register of every
        thread through it."""
        prog, stmts = self.prog, dict(self.prog.statements)
        roots = [e[2] for e in self.found]
        roots += [("ref", prog.results[o]) for o in self.full_outs + self.sums]
        shared, stack = set(), list(roots)
        while stack:
            e = stack.pop()
            if e[0] == "ref" and e[1] in stmts and e[1] not in shared:
                shared.add(e[1])
                stack.append(stmts[e[1]])
            stack.extend(_operands(e))
        return frozenset(prog.per_row) - shared

    def expr(self, e):
        return _expr(e, self.dtype, self.reductions)

    def load(self, ptr, index):
        """Element ``index`` of ``ptr`` in the compute format."""
        return _load(self.c, self.widen, self.formats, ptr, index)

    def store_to(self, o, value):
        """``value`` converted for output ``o``'s memory."""
        return _store(self.store, self.formats, o, value)

    def element_lambda(self, roots, tail, returns=""):
        """A lambda (const In& e, long long j, bool ok) computing the
        expressions ``roots``, ending with the lines ``tail(their C
        expressions)``.  ``ok`` is false on a held row's slots past the
        row's end (``s.each`` computes on them too): a row input is not
        read there (j is past it), and ``tail`` folds nothing."""
        stmts, leaves = _element_slice(self.prog, roots)
        c = self.c
        body = ["(void)e;", "(void)j;", "(void)ok;"]
        body += [f"const {c} {_cname(slot)} = e.{_cname(slot)};"
                 for _, slot, _ in self.elements if slot in leaves]
        body += [f"const {c} {_cname(slot)} = ok ? {self.widen.format(f'{ptr}[j]')} : {c}(0);"
                 for ptr, slot in self.row_inputs if slot in leaves]
        if "col" in leaves:
            body.append(f"const {c} j_col = {c}(j);")
        body += [f"const {c} {_cname(slot)} = {self.expr(expr)};" for slot, expr in stmts]
        body += tail([self.expr(r) for r in roots])
        return ([f"[&](const In& e, const long long j, const bool ok){returns} {{"]
                + [f"    {line}" for line in body] + ["}"])

    def per_row_statements(self, level=None):
        """The per-row statements every thread computes once the reductions
        of ``level`` are done (level 0: at the row's start); None: those
        the leader alone computes (:meth:`_leader_only`), in program order."""
        return [f"const {self.c} {_cname(slot)} = {self.expr(expr)};"
                for slot, expr in self.prog.statements
                if slot in self.prog.per_row
                and (slot in self.leader_only if level is None
                     else slot not in self.leader_only and self.depth[slot] == level)]


#: The combining function of each reduction in kernels/fused.cuh.
_COMBINE = {"sum": "fx::Sum", "mean": "fx::Sum", "max": "fx::Max", "min": "fx::Min"}


def _row_reductions(rc):
    """The start of the row lambda's body: per-row reads, then each level of
    reductions (one pass ``s.each``, then ``s.reduce``) and the per-row
    values it allows."""
    c, op, prog = rc.c, rc.op, rc.prog
    lines = ["(void)r;", "(void)live;"]
    for p in op.cols:   # per-row inputs, and per-row outputs whose old value is read
        if p in op.inputs or p in prog.reads_old:
            ptr, name = ("in_", "v_") if p in op.inputs else ("out_", "o_")
            lines.append(f"const {c} {name}{p} = live ? {rc.load(ptr + p, 'r')} : {c}(0);")
    lines += rc.per_row_statements(0)
    for level in range(1, max(rc.found.values(), default=0) + 1):
        here = [(e, rc.reductions[e]) for e, lv in rc.found.items() if lv == level]
        lines.append(f"// Level {level}: " + ", ".join(f"{n} = {e[1]}(...)" for e, n in here))
        lines += [f"{c} {n} = {_COMBINE[e[1]]}::identity<{c}>();" for e, n in here]
        # Each term pinned (s.keep: fx::keep in a block row) before the fold
        # that ok guards, so that it is computed on every slot and the
        # outputs' pass reuses it.
        lam = rc.element_lambda([e[2] for e, _ in here], lambda args: [
            f"const {c} k{i} = s.keep({a});" for i, a in enumerate(args)] + [
            f"{n} = ok ? {_COMBINE[e[1]]}{{}}({n}, k{i}) : {n};"
            for i, ((e, n), a) in enumerate(zip(here, args))])
        lines += ["s.each(" + lam[0]] + lam[1:-1] + ["});"]
        # Two reductions of a level share one barrier (s.reduce_pair).
        for i in range(0, len(here), 2):
            pair = here[i:i + 2]
            if len(pair) == 2:
                (ea, na), (eb, nb) = pair
                lines.append(f"s.reduce_pair({na}, {_COMBINE[ea[1]]}{{}}, "
                             f"{nb}, {_COMBINE[eb[1]]}{{}});")
            else:
                (ea, na), = pair
                lines.append(f"{na} = s.reduce({na}, {_COMBINE[ea[1]]}{{}});")
            lines += [f"{n} = {n} / {c}(cols);" for e, n in pair if e[1] == "mean"]
        lines += rc.per_row_statements(level)
    return lines


def _output_roots(rc):
    """The expressions of the full outputs, then of the summed outputs'
    terms: what the outputs' pass computes for an element."""
    return [("ref", rc.prog.results[o]) for o in rc.full_outs + rc.sums]


def _outputs_lambda(rc):
    """The lambda of the outputs' pass: an element's full outputs and its
    terms of the summed outputs (``Values``), from its inputs and the row's
    per-row values (captured)."""
    roots = _output_roots(rc)
    fields = [f"o.{o}" for o in rc.full_outs] + [f"o.sums[{i}]" for i in range(len(rc.sums))]
    return rc.element_lambda(roots, lambda args: ["Values o;"] + [
        f"{f} = {a};" for f, a in zip(fields, args)] + ["return o;"], " -> Values")


def _row_function(rc):
    """The body of the row lambda ``row(s, r, live)``: per-row reads, each
    level of reductions (one pass ``s.each``, then ``s.reduce``), the full
    outputs (``s.outputs``) and the per-row outputs (one thread)."""
    prog = rc.prog
    lines = _row_reductions(rc)
    if rc.full_outs or rc.sums:
        # One pass computes an element's full outputs and its terms of the
        # sums (the strategy adds them to its columns' running sums).
        lam = _outputs_lambda(rc)
        what = ("The full outputs." if not rc.sums else "The summed outputs' terms."
                if not rc.full_outs else "The full outputs and the summed outputs' terms.")
        lines += [f"// {what}", "s.outputs(" + lam[0]] + lam[1:-1] \
            + ["}, store, store_packets);"]
    if rc.row_outs:
        lines += ["// The per-row outputs, once every read of the row is done.", "s.sync();",
                  "if (live && s.leader()) {"]
        lines += [f"    {line}" for line in rc.per_row_statements()]
        lines += [f"    out_{o}[r] = {rc.store_to(o, _cname(prog.results[o]))};"
                  for o in rc.row_outs]
        lines += ["}"]
    return lines


def _row_values(rc):
    """The C names of the per-row values that the outputs' pass reads
    (per-row inputs, reductions, per-row statements; not the kernel's
    scalars), sorted: what a batch of streamed rows keeps for each row."""
    prog, roots = rc.prog, _output_roots(rc)
    stmts, _ = _element_slice(prog, roots)
    names, stack = set(), roots + [expr for _, expr in stmts]
    while stack:
        e = stack.pop()
        if e[0] == "reduce":
            names.add(rc.reductions[e])
        elif e[0] == "ref":
            if e[1] in prog.per_row and not e[1].startswith("sc:"):
                names.add(_cname(e[1]))
        else:
            stack.extend(_operands(e))
    return sorted(names)


def _batch_functions(rc):
    """The two halves of the row lambda that ``fx::stream_rows_sums`` runs
    on a batch of streamed rows: ``row_values(s, r, live)``, the row's
    reductions returning the per-row values the outputs read (``RowVals``),
    and ``element(v, e, j)``, an element's ``Values`` from them."""
    c, names = rc.c, _row_values(rc)
    lines = ["struct RowVals { " + " ".join(f"{c} {n};" for n in names) + " };",
             "const auto row_values = [&](auto& s, const long long r, const bool live) {"]
    lines += [f"    {line}" for line in _row_reductions(rc)]
    lines += ["    RowVals v;"] + [f"    v.{n} = {n};" for n in names]
    lines += ["    return v;", "};",
              "const auto element = [&](const RowVals& v, const In& e, const long long j) {",
              "    (void)v;"]
    lines += [f"    const {c} {n} = v.{n};" for n in names]
    lam = _outputs_lambda(rc)
    lines += ["    const auto f = " + lam[0]] + [f"    {line}" for line in lam[1:-1]]
    lines += ["    };", "    return f(e, j, true);", "};"]
    return lines


def _row_memory(rc):
    """The lambdas that read one element's values (``In``) or a packet of W
    of them, and that store the full outputs (``Values``) by element or by
    packet, and the test of whether packets may be used."""
    c, elements = rc.c, rc.elements
    lines = ["const auto load = [&](const long long r, const long long j) {",
             "    (void)r;", "    (void)j;", "    In v;"]
    lines += [f"    v.{_cname(slot)} = {rc.load(ptr, index)};"
              for ptr, slot, is_row in elements
              for index in ["j" if is_row else "r * cols + j"]]
    # Packet q of every full array, counted from the arrays' starts (the
    # strategy gives row r's as r * (cols / W) + p, or a streamed row's
    # aligned middle), and columns c .. c + W - 1 of the held row inputs.
    lines += ["    return v;", "};",
              "const auto load_packets = [&](const long long q, const long long c) {",
              "    (void)q;", "    (void)c;", "    Lanes<In, W> v;"]
    lines += ["    " + (f"const Packet<T> p{i} = load_row_packet({ptr}, c);" if is_row
                         else _load_packet(rc.formats, f"p{i}", ptr, "q"))
              for i, (ptr, _, is_row) in enumerate(elements)]
    lines += ["#pragma unroll", "    for (int k = 0; k < W; ++k) {"]
    lines += [f"        v.v[k].{_cname(slot)} = p{i}.v[k];"
              for i, (_, slot, _) in enumerate(elements)]
    lines += ["    }", "    return v;", "};"]
    if rc.full_outs or rc.sums:
        # The summed outputs' terms ride in Values::sums, which the strategy
        # reads (kernels/fused.cuh); store writes the full outputs only.
        fields = [f"{c} {o};" for o in rc.full_outs]
        fields += [f"{c} sums[{len(rc.sums)}];"] if rc.sums else []
        idle = not rc.full_outs   # nothing to store: (void) the lambdas' arguments
        lines += [f"struct Values {{ {' '.join(fields)} }};",
                  "const auto store = [&](const long long r, const long long j, "
                  "const Values& o) {"]
        lines += (["    (void)r;", "    (void)j;", "    (void)o;"] if idle
                  else ["    const long long e = r * cols + j;"])
        lines += [f"    out_{o}[e] = {rc.store_to(o, f'o.{o}')};" for o in rc.full_outs]
        lines += ["};", "const auto store_packets = [&](const long long q, "
                  "const Lanes<Values, W>& o) {"]
        lines += ["    (void)q;", "    (void)o;"] if idle else []
        lines += ["    " + _store_packet(c, rc.formats, o, "q", "o") for o in rc.full_outs]
        lines += ["};"]
    # Packets where every array allows them (the strategy adds its own test
    # of the row length: kernels/fused.cuh).
    pointers = [ptr for ptr, _, _ in elements] + [f"out_{o}" for o in rc.full_outs]
    lines.append("const bool aligned = "
                 + (" && ".join(_aligned(q, rc.formats) for q in pointers) or "true") + ";")
    return lines


def row_kernel_source(op, dtype, block, formats=None):
    """The CUDA source of a row kernel: ``op``'s body (which reduces along
    the last axis, reads ``col`` or has per-row arrays) on rows of the full
    arrays, for ``dtype``, launched with ``block`` threads at most.

    Parameters as the elementwise kernel's (module docstring), but the last
    two are ``long long rows, long long cols`` (the product of the full
    arrays' leading dimensions and their last dimension).  The kernel hands
    a generic lambda ``row(s, r, live)``, the body on row r, to
    ``fx::rows_loop`` of kernels/fused.cuh, which runs it with the strategy
    that cols allows (lane groups or a block holding the row in registers,
    or a block streaming it from memory): per-row inputs are read once, then
    each level of reductions (:func:`_levels`) is one ``s.each`` over the
    row's elements, computing what the reductions' arguments need and
    folding them into per-thread partials, and one ``s.reduce`` per
    reduction; then the per-row values of that level; last, the full outputs
    per element and the per-row outputs by one thread, which alone computes
    the per-row values that only they need.  Summed (``:row``)
    outputs: the outputs' pass also gives each element's terms
    (``Values::sums``), which the strategy adds to its columns' running sums,
    and ``fx::rows_loop_sums`` ends the launch by adding the blocks' partial
    rows in block order (``finish_sums``), in the workspace and counters of
    the last three parameters.  Accumulation is in
    the compute format (float for float32 and the halves, double for
    float64); ``mean`` is the sum divided by ``cols``; ``max`` and ``min``
    propagate NaN.  ``formats`` as :func:`kernel_source`'s."""
    formats = formats or {}
    rc = _RowContext(op, dtype, formats)
    c = rc.c
    params = []
    for p in op.params:
        if p in op.scalars:
            params += [f"const T* sp_{p}", f"{c} sv_{p}"]
        else:
            t = _array_type(p, formats)
            params.append(f"{t}* out_{p}" if p in op.outputs else f"const {t}* in_{p}")
    params += ["long long rows", "long long cols"]
    if op.sums:
        params += ["C* sum_partials", "unsigned int* sum_counters", "long long sum_group"]
    lines = [
        *_preamble(op, dtype, block, params, row=True, formats=formats),
        "    // Elements held per thread: a lane group's, or a block's.",
        f"    constexpr int R = STRATEGY == 0 ? {lane_elements(op, dtype)} : "
        f"{held_elements(op, dtype)};",
        *_scalars(op, dtype),
        "    // One element's values read from memory, in the compute format.",
        "    struct In { " + " ".join(f"{c} {_cname(slot)};" for _, slot, _ in rc.elements)
        + " };",
        *[line if line.startswith("#") else f"    {line}" for line in _row_memory(rc)],
        "    // The body on row r (live: r is a row; lane groups past the last row",
        "    // only join the shuffles).",
        "    const auto row = [&](auto& s, const long long r, const bool live) {",
        *[f"        {line}" for line in _row_function(rc)],
        "    };",
        *([f"    {line}" for line in _sums_tail(rc)] if op.sums else
          ["    fx::rows_loop<T, R, In, STRATEGY>(rows, cols, aligned, load, load_packets, "
           "row);"]),
        "}",
        "",
    ]
    # One kernel per strategy (the host picks it: strategy()): a kernel
    # holding them all took the registers of the hungriest (52 for softmax
    # in float32, where its block path alone needs 43), and so fewer threads.
    names = [p.rsplit(" ", 1)[1].lstrip("*") for p in params]
    # A lane kernel holding more than LANE_HELD_MOST (LANE_SUMMED_HALF) is
    # bound by the block it runs in, BLOCK, not by the longest row's block.
    lane_bound = min(block, BLOCK) if lane_elements(op, dtype) > LANE_HELD_MOST else block
    for i, what in enumerate(STRATEGIES):
        bound = lane_bound if i == 0 else block
        lines += [f'extern "C" __global__ void __launch_bounds__({bound}) '
                  f"{kernel_name(op, dtype, formats)}_{what}(",
                  "        " + ", ".join(params) + ") {",
                  f"    {kernel_name(op, dtype, formats)}_body<{i}>({', '.join(names)});",
                  "}", ""]
    return "\n".join(lines)


def _sums_tail(rc):
    """The end of a row kernel with summed outputs: the lambda that stores
    summed output i's column j, and rows_loop_sums, whose blocks sum their
    rows' terms and then combine them in block order (kernels/fused.cuh)."""
    # rc.elements: the arrays a row holds (a held row input is in cache).
    lines = ["// Asks the L2 for element j of row r of every full array a row loads",
             "// (the loop over rows asks for the next row while it reduces this one).",
             "const auto prefetch = [&](const long long r, const long long j) {",
             "    (void)r;", "    (void)j;"]
    lines += [f"    fx::prefetch_l2({ptr} + r * cols + j);" for ptr, _, is_row in rc.elements
              if not is_row]
    lines += ["};",
              "// Summed output i's column j (i a constant where finish_sums calls it).",
              "const auto store_sum = [&](const int i, const long long j, const C v) {"]
    lines += [f"    if (i == {i}) out_{o}[j] = {rc.store.format('v')};"
              for i, o in enumerate(rc.sums)]
    lines += ["};",
              "const fx::GridSums<C> grid_sums{sum_partials, sum_counters, sum_group};"]
    loop = [f"fx::rows_loop_sums<T, R, In, {len(rc.sums)}, STRATEGY, "
            f"STRATEGY == 3 ? {trip_rows(rc.op, rc.dtype)} : 1>(",
            "    rows, cols, aligned, load, load_packets, prefetch, row, grid_sums, store_sum);"]
    batch = stream_batch(rc.op, rc.dtype)
    if batch == 1:
        return lines + loop
    # Streamed rows go in batches (STREAM_BATCH): the row lambda in two.
    lines += _batch_functions(rc)
    lines += [f"if constexpr (STRATEGY == {STRATEGIES.index('stream')}) {{",
              f"    fx::stream_rows_sums<T, In, {len(rc.sums)}, {batch}>(",
              "        rows, cols, aligned, load, load_packets, row_values, element, store,",
              "        grid_sums, store_sum);",
              "} else {"] + [f"    {line}" for line in loop] + ["}"]
    return lines
