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

All arithmetic is in the handler's precision: ``T`` is ``float`` or
``double``, constants are literals of T, math goes through the ``dm::`` and
``fx::`` overloads (``expf`` for float).  Parameters, in the declaration's
order: ``const T*`` per array input, ``const T*, T`` per scalar (a device
scalar's address or 0, and the number), ``T*`` per output, then ``long long
n`` (elements) and ``long long cols`` (the outputs' last dimension).
:func:`kernel_format` gives the same list as launch codes.
"""
import numpy as np

from ..fused import OPERATIONS

#: How each operation of a program is written in CUDA ({0}, {1}, ... its
#: operands, already parenthesised where needed).  Must cover OPERATIONS.
CUDA = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "pow": "dm::pow({0}, {1})",
    # comparisons give 1 or 0; every comparison with NaN is false (!= true)
    "lt": "({0} < {1} ? T(1) : T(0))", "le": "({0} <= {1} ? T(1) : T(0))",
    "gt": "({0} > {1} ? T(1) : T(0))", "ge": "({0} >= {1} ? T(1) : T(0))",
    "eq": "({0} == {1} ? T(1) : T(0))", "ne": "({0} != {1} ? T(1) : T(0))",
    # a condition is true where it is not 0 (NaN is true, as in where_t)
    "and": "({0} != T(0) && {1} != T(0) ? T(1) : T(0))",
    "or": "({0} != T(0) || {1} != T(0) ? T(1) : T(0))",
    "not": "({0} == T(0) ? T(1) : T(0))",
    "where": "({0} != T(0) ? {1} : {2})",
    "max": "fx::max({0}, {1})", "min": "fx::min({0}, {1})",
    "exp": "dm::exp({0})", "expm1": "dm::expm1({0})", "log": "dm::log({0})",
    "log1p": "fx::log1p({0})", "sqrt": "dm::sqrt({0})", "rsqrt": "dm::rsqrt({0})",
    "tanh": "dm::tanh({0})", "abs": "dm::abs({0})", "sigmoid": "fx::sigmoid({0})",
    "erf": "fx::erf({0})", "ipow": "fx::ipow<{k}>({0})",
}
assert set(CUDA) == OPERATIONS, set(CUDA) ^ OPERATIONS

_CTYPE = {np.dtype(np.float32): ("float", "f32", "f"), np.dtype(np.float64): ("double", "f64", "d")}


def kernel_name(op, dtype):
    """The kernel's name: the op's name, its declaration's hash and the dtype."""
    return f"fused_{op.name}_{op.digest}_{_CTYPE[np.dtype(dtype)][1]}"


def kernel_format(op, dtype):
    """The launch format (struct codes of ``handlers/cuda/_launch.c``): ``P``
    per array, ``P`` and the dtype's code per scalar, then ``qq``."""
    code = _CTYPE[np.dtype(dtype)][2]
    return "".join("P" + code if p in op.scalars else "P" for p in op.params) + "qq"


def literal(value, dtype):
    """``value`` as a CUDA literal of ``dtype``, rounded as NumPy rounds it."""
    if np.isinf(value):
        return "dm::infinity<T>()" if value > 0 else "(-dm::infinity<T>())"
    if np.dtype(dtype) == np.float32:
        # The shortest decimal of the float32 value, read back exactly by nvcc.
        return repr(float(np.float32(value))) + "f"
    return repr(float(value))


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
    return CUDA[kind].format(*(_expr(a, dtype) for a in e[1:]))


def kernel_source(op, dtype, block):
    """The CUDA source of ``op``'s kernel for ``dtype``, launched with
    ``block`` threads per block (its ``__launch_bounds__``)."""
    ctype = _CTYPE[np.dtype(dtype)][0]
    prog = op.program
    params = []
    for p in op.params:
        if p in op.scalars:
            params += [f"const T* sp_{p}", f"T sv_{p}"]
        elif p in op.outputs:
            params.append(f"T* out_{p}")
        else:
            params.append(f"const T* in_{p}")
    params += ["long long n", "long long cols"]
    rows = bool(op.rows)
    counter = "MixedRadix" if rows else "NoCounter"
    load = []
    for p in op.params:
        if p in op.scalars:
            continue
        if p in op.outputs:
            if p in prog.reads_old:
                load.append(f"const T o_{p} = out_{p}[e];")
        else:
            load.append(f"const T v_{p} = in_{p}[{'c.d0' if p in op.rows else 'e'}];")
    for slot, expr in prog.statements:
        load.append(f"const T {_cname(slot)} = {_expr(expr, dtype)};")
    load.append("Values r;")
    load += [f"r.{o} = {_cname(prog.results[o])};" for o in op.outputs]
    load.append("return r;")
    store = " ".join(f"out_{o}[e] = r.{o};" for o in op.outputs)
    body = "\n".join(f"    // {line}" for line in prog.text.split("; "))
    lines = [
        f'// Fused op "{op.name}" ({ctype}), generated by handlers/cuda/fused_source.py:',
        body,
        '#include "fused.cuh"',
        "",
        f"namespace {{ using T = {ctype}; }}",
        "",
        f'extern "C" __global__ void __launch_bounds__({block}) {kernel_name(op, dtype)}(',
        "        " + ", ".join(params) + ") {",
        "    using namespace sh;",
        *[f"    const T s_{s} = sp_{s} ? *sp_{s} : sv_{s};" for s in op.scalars],
        "    struct Values { " + " ".join(f"T {o};" for o in op.outputs) + " };",
        # d0 = the column of the element (rows of cols elements; radix1 = 1
        # leaves the row count in d2, unused).
        f"    {counter} at{'(grid_thread(), grid_stride(), cols, 1)' if rows else ''};",
        "    (void)cols;",
        "    batched_loop<kVec<T>>(",
        "        0, n, at,",
        f"        [&](long long e, const {counter}& c) {{",
        "            (void)c;",
        *[f"            {line}" for line in load],
        "        },",
        f"        [&](long long e, const Values& r) {{ {store} }});",
        "}",
        "",
    ]
    return "\n".join(lines)
