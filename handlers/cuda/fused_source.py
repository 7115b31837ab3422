"""CUDA source of a fused op (``handlers.fused.FusedOp``): one kernel per
declaration and dtype.

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
dimension).  :func:`kernel_format` gives the same list as launch codes.
"""
import numpy as np

from .. import dtypes
from ..fused import OPERATIONS

#: How each operation of a program is written in CUDA ({0}, {1}, ... its
#: operands, already parenthesised where needed; {C} the name of the compute
#: format in the source).  Must cover OPERATIONS.
CUDA = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
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


def kernel_name(op, dtype):
    """The kernel's name: the op's name, its declaration's hash and the dtype
    (``f32``, ``f64``, ``bf16``, ``f16``)."""
    return f"fused_{op.name}_{op.digest}_{dtypes.short_name(dtype)}"


def kernel_format(op, dtype):
    """The launch format (struct codes of ``handlers/cuda/_launch.c``): ``P``
    per array, ``P`` and the compute format's code per scalar (``f`` for
    float32 and the halves, ``d`` for float64), then ``qq``."""
    code = _ctype(dtype)[2]
    return "".join("P" + code if p in op.scalars else "P" for p in op.params) + "qq"


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


def _expr(e, dtype):
    kind = e[0]
    if kind == "num":
        return literal(e[1], dtype)
    if kind == "ref":
        return _cname(e[1])
    if kind == "ipow":
        return CUDA["ipow"].format(_expr(e[1], dtype), k=e[2])
    return CUDA[kind].format(*(_expr(a, dtype) for a in e[1:]), C=_compute_name(dtype))


def kernel_source(op, dtype, block):
    """The CUDA source of ``op``'s kernel for ``dtype``, launched with
    ``block`` threads per block (its ``__launch_bounds__``)."""
    ctype, cctype, _ = _ctype(dtype)
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
            params.append(f"T* out_{p}")
            if p in prog.reads_old:
                arrays.append(("out_" + p, "o_" + p, False))
        else:
            params.append(f"const T* in_{p}")
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

    def loads(index, row_index, lane=""):
        return ", ".join(widen.format(f"{ptr}[{row_index if row else index}]{lane}")
                         for ptr, _, row in arrays)

    f_body = [f"const {c} {_cname(slot)} = {_expr(expr, dtype)};"
              for slot, expr in prog.statements]
    f_body += ["Values r;", *[f"r.{o} = {_cname(prog.results[o])};" for o in op.outputs],
               "return r;"]
    if half:
        store = " ".join(f"out_{o}[e] = st<T>(r.{o});" for o in op.outputs)
    else:
        store = " ".join(f"out_{o}[e] = r.{o};" for o in op.outputs)
    store_packets = " ".join(
        f"{{ Packet<T> q; for (int k = 0; k < W; ++k) q.v[k] = r.v[k].{o}; "
        f"store_packet(out_{o}, p, q); }}" for o in op.outputs)
    packet_loads = [f"const Packet<T> {ptr}_p = load_packet({ptr}, {'c.d0' if row else 'p'});"
                    for ptr, _, row in arrays]
    body = "\n".join(f"    // {line}" for line in prog.text.split("; "))
    if half:
        title = f"{ctype} stored, {cctype} math rounded once on store"
        types = f"namespace {{ using T = {ctype}; using C = {cctype}; }}"
        scalar = "const C s_{0} = sp_{0} ? ld(*sp_{0}) : sv_{0};"
    else:
        title = ctype
        types = f"namespace {{ using T = {ctype}; }}"
        scalar = "const T s_{0} = sp_{0} ? *sp_{0} : sv_{0};"
    lines = [
        f'// Fused op "{op.name}" ({title}), generated by handlers/cuda/fused_source.py:',
        body,
        '#include "fused.cuh"',
        "",
        types,
        "",
        f'extern "C" __global__ void __launch_bounds__({block}) {kernel_name(op, dtype)}(',
        "        " + ", ".join(params) + ") {",
        "    using namespace sh;",
        "    constexpr int W = kVec<T>;",
        *["    " + scalar.format(s) for s in op.scalars],
        "    struct Values { " + " ".join(f"{c} {o};" for o in op.outputs) + " };",
        "    // The body, on one element's inputs (and old outputs where it reads them).",
        "    const auto f = [&](" + ", ".join(f"const {c} {name}" for _, name, _ in arrays)
        + ") -> Values {",
        *[f"        {line}" for line in f_body],
        "    };",
        # Packets when every array is 16-byte aligned and (with a row input)
        # a packet never straddles two rows; the bulk then moves in 16-byte
        # accesses, as elementwise.cu's ops do.
        "    const bool aligned = " + " && ".join(f"is_aligned16({q})" for q in pointers)
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
