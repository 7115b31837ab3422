"""User-defined fused ops: declared once, run on every handler::

    from handlers import fused_op
    gelu = fused_op("gelu", inputs="x", outputs="y",
                    body="y = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x ** 3)))")
    gelu(h, x, y)                 # any handler, stream-group view or DebugHandler

A declaration names its inputs (arrays and scalars), its outputs and a body of
assignments over them.  :func:`fused_op` parses the body with :mod:`ast`
(user text is never evaluated) into a small program of SSA statements, and
from the declaration derives everything else, as the op table does for the
contract's ops: an :class:`handlers.optable.Op` row (so the call is validated
by the same generated checks, and DebugHandler knows its reads and writes),
the NumPy evaluation (here) and the CUDA kernel
(``handlers/cuda/fused_source.py``).  Both evaluate the same program, one
operation of the program at a time, in the handler's dtype (a reduction's
sums are grouped differently: NumPy's pairwise, the kernel's per-thread
partial sums and a tree, so they agree to rounding).

Why an object called with the handler, not a handler method: a declaration is
process-wide, like a kernel, and belongs to no handler; the same object works
on every handler, view and wrapper, and adds no names to the contract.

The language (:data:`FUNCTIONS` and :data:`REDUCTIONS` list the calls):

* statements ``name = expr`` (and ``name += expr`` etc.), on lines or
  separated by ``;``.  A name assigned that is not an output is a temporary;
  a name may be assigned again (each assignment is a new value).  An output
  read before it is first assigned reads its old contents (``y = y + x``
  accumulates), which makes it read-and-written (``y+=`` in the table);
* numbers, the names of inputs, scalars, outputs and earlier temporaries;
  ``+ - * / **`` and unary ``-``; ``x ** k`` with an integer literal
  ``|k| <= 64`` is a product of squarings (the same on both backends), any
  other exponent is ``pow``;
* comparisons ``< <= > >= == !=`` (chains allowed), ``and``, ``or``, ``not``
  and ``a if c else b``: a condition is true where it is not 0, so NaN is
  true, as in ``where_t``; comparisons give 1.0 or 0.0 and are false on NaN
  (but ``!=``, true);
* ``max`` and ``min`` propagate NaN (as ``maximum_tt``, ``numpy.maximum``):
  ``max(x, 0)`` of NaN is NaN;
* reductions along the last axis (:data:`REDUCTIONS`): ``sum(e)``,
  ``mean(e)``, ``max(e)`` and ``min(e)`` with one argument (``axis=-1`` may
  be written; no other axis is taken).  The arrays are rows along their last
  axis (a 1-D array is one row), and a reduction gives one value per row,
  which the rest of the body uses elementwise, broadcast along the row.  A
  reduction may reduce a value that depends on another reduction
  (``m = max(x); s = sum(exp(x - m))``).  ``max`` and ``min`` of a row with
  a NaN are NaN; ``mean`` is the sum divided by the row's length.  A body
  that reduces refuses arrays whose rows are empty (last dimension 0);
* ``col``, the column of the element within its row (0, 1, ... as a number
  of the compute format), so that an integer class target picks its column:
  ``picked = sum(where(col == t, z, 0))``.

Per-row arrays: an input or output declared ``name:col`` holds one value per
row, shape ``(..., 1)`` (the full arrays' shape with last dimension 1, a
column vector for matrices).  A per-row input is broadcast along the row; a
per-row output must be assigned a per-row value (one that depends only on
reductions, per-row inputs, scalars and numbers), else the declaration
raises.  For example, softmax and LayerNorm::

    softmax = fused_op("softmax", "x", "y", "m = max(x); e = exp(x - m); y = e / sum(e)")
    layer_norm = fused_op("layer_norm", "x g:row b:row #eps", "y mu:col r:col",
                          "mu = mean(x); d = x - mu; r = rsqrt(mean(d * d) + eps); "
                          "y = d * r * g + b")

Summed rows: an output declared ``name:row`` is one row, shape ``(n,)`` or
``(1, n)`` like a ``:row`` input (``n`` the full arrays' last dimension),
and holds the sum over all rows (every leading axis) of the value assigned
to it: the adjoint of a ``:row`` input's broadcast, the gradient of a gain
or a bias.  The value may vary along the row (column ``j`` gets the sum of
its column) or be per row (broadcast along the row first, so every column
gets the sum of the per-row values).  The body cannot read such an
output's old contents (the declaration raises: there is no per-row old
value to read; after an assignment its name is the value assigned, per
element, not the sum); it must not overlap any input or other output, and
an op with no rows writes zeros to it.  Any such output makes the op
row-wise (a row kernel on the GPU), with or without reductions.  The sums
are computed in the handler's dtype on NumPy (float32 for the halves) and
in the compute format on the GPU, where each block sums the rows it takes
and the last blocks to finish add those partial rows in block order:
reproducible bit for bit, with no atomic additions of values.  LayerNorm's
backward pass, reading ``dy`` and ``x`` once::

    layer_norm_backward = fused_op(
        "layer_norm_backward", "dy x g:row mu:col r:col", "dx dg:row db:row",
        "xhat = (x - mu) * r; gy = dy * g; "
        "dx = r * (gy - mean(gy) - xhat * mean(gy * xhat)); dg = dy * xhat; db = dy")

Arrays of any format: a full or per-row array declared with a trailing ``^``
(``x^``, ``dy^``, ``t:col^``) may be of any format the handler's class holds,
an array of a twin (``Handler.twin``), where the others are of the handler's.
The body computes in the handler's format: such an input is converted as it
is loaded, such an output rounded once as it is stored, in the same pass
(no ``cast_t`` either way).  Mixed precision's loss reads half logits and
writes the half gradient so::

    xent = fused_op("xent", "y^ t:col", "loss:col dy^",
                    "m = max(y); e = exp(y - m); s = sum(e); hit = col == t; "
                    "loss = log(s) + m - sum(where(hit, y, 0)); dy = e / s - hit")
    xent(h32, y_bf16, labels, loss, dy_bf16)   # h32: the float32 twin

Such an output may be an input's memory only where both have one format
(ValueError otherwise); ``:row`` arrays take no ``^``.  On the GPU each
combination of formats is its own kernel, which moves a ``^`` array in the
handler's packets of W elements (4 bfloat16 in 8 bytes beside float32's
16-byte packets).

Errors in a declaration raise ``ValueError`` naming the op and, for the body,
the line and column.  A statement's expression may nest at most
:data:`MAX_DEPTH` operations (a chain ``a + b + c`` nests two, as does
``a and b and c``); a deeper one is refused with a ``ValueError`` naming
``fused_op`` and the limit, never a ``RecursionError``.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import keyword
import math
import re

import numpy as np

from . import optable
from .checks import fail_value

__all__ = ["FUNCTIONS", "FusedOp", "MAX_DEPTH", "OPERATIONS", "REDUCTIONS", "fused_op"]

#: The elementwise functions a body may call, with their number of arguments.
FUNCTIONS = {"exp": 1, "expm1": 1, "log": 1, "log1p": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1,
             "sigmoid": 1, "abs": 1, "erf": 1, "max": 2, "min": 2, "where": 3}
#: The reductions along the last axis: these functions with one argument
#: (``max`` and ``min`` with two are elementwise).
REDUCTIONS = ("sum", "mean", "max", "min")
#: The built-in value of a body: the element's column within its row.
COLUMN = "col"
#: Names a parameter or a value cannot take: the functions and ``col``.
RESERVED = frozenset(FUNCTIONS) | frozenset(REDUCTIONS) | {COLUMN}
#: Every operation of a parsed program: the functions plus the operators.
#: Each evaluator (NumPy below, CUDA in fused_source) implements exactly these.
OPERATIONS = frozenset(FUNCTIONS) | {"add", "sub", "mul", "div", "neg", "pow", "ipow",
                                     "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not"}
#: The largest integer exponent taken as repeated multiplication.
MAX_INT_POWER = 64
#: The deepest a statement's expression may nest operations.  Parsing,
#: evaluating and generating the kernel each recurse once (or a few times)
#: per level, well within Python's recursion limit at this depth.
MAX_DEPTH = 100

_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq",
            ast.NotEq: "ne"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# ============================================================================ the program
class Program:
    """A parsed body.  Expressions are tuples: ``("num", value)``,
    ``("ref", slot)``, ``("col",)`` (the column index), ``("ipow", expr, k)``,
    ``("reduce", kind, expr)`` (``kind`` one of :data:`REDUCTIONS`, along the
    last axis) or ``(operation, *exprs)``.
    Slots: ``"in:x"`` an array input, ``"sc:s"`` a scalar, ``"old:y"`` the
    old contents of output y, ``"t3:u"`` the value of statement 3 (which
    assigns u).  ``statements`` is a list of (slot, expr); ``results`` maps
    each output to the slot of its last assignment; ``reads_old`` are the
    outputs whose old contents are read; ``text`` the statements as source;
    ``per_row`` the slots holding one value per row (scalars, per-row inputs
    and outputs, and statements computed from those, reductions and numbers
    only); ``reduces`` and ``uses_col`` whether the body reduces and reads
    ``col``."""

    def __init__(self, statements, results, reads_old, text, per_row=frozenset(),
                 reduces=False, uses_col=False):
        self.statements, self.results = statements, results
        self.reads_old, self.text = reads_old, text
        self.per_row, self.reduces, self.uses_col = frozenset(per_row), reduces, uses_col


class _Parser:
    """Turns the body's syntax tree into a :class:`Program`, checking it."""

    def __init__(self, op, arrays, scalars, outputs, cols=(), sums=()):
        self.op = op
        self.level = 0           # operations nested around the expression being parsed
        self.env = {n: f"in:{n}" for n in arrays}
        self.env.update({n: f"sc:{n}" for n in scalars})
        self.inputs = set(arrays) | set(scalars)
        self.outputs = outputs
        self.cols = set(cols)    # per-row (':col') inputs and outputs
        self.sums = set(sums)    # outputs summed over the rows (':row')
        self.read = set()        # inputs, scalars and old outputs read
        self.reads_old = []
        # Slots of one value per row: scalars, per-row inputs, then the
        # statements computed from per-row values only.
        self.per_row = {f"sc:{n}" for n in scalars} | {f"in:{n}" for n in arrays
                                                        if n in self.cols}
        self.reduces = self.uses_col = False

    def fail(self, node, msg, hint=""):
        where = f" at line {node.lineno}, column {node.col_offset + 1}" if node else ""
        fail_value(self.op, f"{msg}{where}{hint}")

    def parse(self, body):
        if not isinstance(body, str):
            fail_value(self.op, f"body must be a str, got {type(body).__name__}")
        try:
            tree = ast.parse(body, mode="exec")
        except SyntaxError as e:
            fail_value(self.op, f"syntax error in the body at line {e.lineno}, column "
                                f"{e.offset}: {e.msg}")
        except (RecursionError, MemoryError):
            # Python's parser gives up on a body nested thousands deep (a
            # MemoryError without a message for the deepest).
            tree = None
        if tree is None:
            fail_value(self.op, f"the body nests deeper than Python's parser can read, far "
                                f"beyond fused_op's limit of {MAX_DEPTH} nested operations")
        statements, text = [], []
        nodes = {}   # slot -> the syntax of its value (for errors)
        for stmt in tree.body:
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                target, value = stmt.target, ast.BinOp(
                    ast.Name(stmt.target.id, ast.Load()), stmt.op, stmt.value)
                ast.copy_location(value, stmt)
                ast.copy_location(value.left, stmt.target)
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  and isinstance(stmt.targets[0], ast.Name)):
                target, value = stmt.targets[0], stmt.value
            else:
                self.fail(stmt, f"unsupported statement {type(stmt).__name__}",
                          " (only 'name = expression')")
            name = target.id
            if name in self.inputs:
                self.fail(target, f"assignment to input {name!r}")
            self.check_name(name, target)
            expr = self.expr(value)
            if _depth(expr) > MAX_DEPTH:   # chains (a and b and ...) nest as they are built
                self.too_deep(value)
            slot = f"t{len(statements)}:{name}"
            statements.append((slot, expr))
            text.append(f"{name} = {ast.unparse(value)}")
            self.env[name] = slot
            nodes[slot] = value
            if _is_per_row(expr, self.per_row):
                self.per_row.add(slot)
        if not statements:
            fail_value(self.op, "the body assigns nothing")
        results = {}
        for out in self.outputs:
            slot = self.env.get(out)
            if slot is None or not slot.startswith("t"):
                fail_value(self.op, f"output {out!r} is never assigned")
            results[out] = slot
            if out in self.cols and slot not in self.per_row:
                # A per-row output holds one value per row: a value that
                # varies along the row has no single value to store there.
                self.fail(nodes[slot], f"output {out!r} is declared per row (':col') but is "
                                       f"assigned a value that varies along the row",
                          " (reduce it with sum, mean, max or min, or declare the output "
                          "without ':col')")
        unread = [n for n in sorted(self.inputs) if n not in self.read]
        if unread:
            # An input the body ignores is almost always a typo, and it would
            # still be validated and tracked as read: refuse it.
            fail_value(self.op, f"input {unread[0]!r} is never read by the body")
        return Program(statements, results, tuple(self.reads_old), "; ".join(text),
                       self.per_row, self.reduces, self.uses_col)

    def check_name(self, name, node):
        if name in RESERVED or name in optable.METHOD_NAMES or not _NAME.match(name):
            self.fail(node, f"{name!r} cannot name a value (a function name, a reserved "
                            f"name or not an ASCII identifier)")

    def ref(self, node):
        name = node.id
        if name == COLUMN:
            self.uses_col = True
            return ("col",)
        slot = self.env.get(name)
        if slot is None and name in self.sums:
            # A summed output has no old value per element or per row to
            # read (and the kernel writes it once, after every row).
            self.fail(node, f"output {name!r} is declared ':row' (a sum over the rows): the "
                            f"body cannot read its old contents",
                      " (assign it before reading the name, or declare it without ':row')")
        if slot is None and name in self.outputs:
            slot = self.env[name] = f"old:{name}"   # read before assigned: the old value
            self.reads_old.append(name)
            if name in self.cols:
                self.per_row.add(slot)
        if slot is None:
            self.fail(node, f"unknown name {name!r}")
        if not slot.startswith("t"):
            self.read.add(name)
        return ("ref", slot)

    def too_deep(self, node):
        self.fail(node, f"the expression nests operations deeper than fused_op's limit of "
                        f"{MAX_DEPTH}")

    def expr(self, node):
        # Each level of the syntax is one level here: bounded, so that a body
        # nested deeper than Python's recursion limit gets this error instead.
        if self.level > MAX_DEPTH:   # a name or number is at the depth of its operations
            self.too_deep(node)
        self.level += 1
        try:
            return self._expr(node)
        finally:
            self.level -= 1

    def _expr(self, node):
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                self.fail(node, f"unsupported constant {v!r} (only real numbers)")
            return ("num", float(v))
        if isinstance(node, ast.Name):
            return self.ref(node)
        if isinstance(node, ast.UnaryOp):
            a = self.expr(node.operand)
            if isinstance(node.op, ast.USub):
                return ("num", -a[1]) if a[0] == "num" else ("neg", a)
            if isinstance(node.op, ast.UAdd):
                return a
            if isinstance(node.op, ast.Not):
                return ("not", a)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            a, b = self.expr(node.left), self.expr(node.right)
            if isinstance(node.op, ast.Pow) and b[0] == "num" and b[1].is_integer() \
                    and abs(b[1]) <= MAX_INT_POWER:
                return ("ipow", a, int(b[1]))
            return (_BINARY[type(node.op)], a, b)
        if isinstance(node, ast.BoolOp):
            kind = "and" if isinstance(node.op, ast.And) else "or"
            values = [self.expr(v) for v in node.values]
            result = values[0]
            for v in values[1:]:
                result = (kind, result, v)
            return result
        if isinstance(node, ast.Compare):
            terms = [self.expr(node.left)] + [self.expr(c) for c in node.comparators]
            result = None
            for op, a, b in zip(node.ops, terms, terms[1:]):
                if type(op) not in _COMPARE:
                    self.fail(node, f"unsupported comparison {type(op).__name__}")
                term = (_COMPARE[type(op)], a, b)
                result = term if result is None else ("and", result, term)
            return result
        if isinstance(node, ast.IfExp):
            return ("where", self.expr(node.test), self.expr(node.body), self.expr(node.orelse))
        if isinstance(node, ast.Call):
            fn = node.func.id if isinstance(node.func, ast.Name) else None
            if fn not in FUNCTIONS and fn not in REDUCTIONS:
                self.fail(node, f"unknown function {ast.unparse(node.func)!r}",
                          f" (known: {', '.join(sorted(set(FUNCTIONS) | set(REDUCTIONS)))})")
            starred = any(isinstance(a, ast.Starred) for a in node.args)
            if fn in REDUCTIONS and len(node.args) == 1 and not starred:
                return self.reduction(node, fn)
            if node.keywords or len(node.args) != FUNCTIONS.get(fn) or starred:
                if fn not in FUNCTIONS:     # sum, mean
                    takes = "1 positional argument (the value to reduce along the last axis)"
                elif fn in REDUCTIONS:      # max, min
                    takes = "1 (a reduction along the last axis) or 2 positional arguments"
                else:
                    takes = f"{FUNCTIONS[fn]} positional argument(s)"
                self.fail(node, f"{fn} takes {takes}")
            return (fn, *(self.expr(a) for a in node.args))
        what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) \
            else type(node).__name__
        self.fail(node, f"unsupported syntax {what} in {ast.unparse(node)!r}")

    def reduction(self, node, fn):
        """``fn(e)`` (one of :data:`REDUCTIONS`) along the last axis; the only
        keyword is ``axis=-1``, which says so."""
        for kw in node.keywords:
            if kw.arg != "axis":
                self.fail(node, f"{fn} takes no keyword {kw.arg or '**'!r} (only axis=-1)")
            try:
                axis = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError):
                axis = None
            if type(axis) is not int or axis != -1:
                self.fail(node, f"{fn}: axis must be -1, got {ast.unparse(kw.value)}",
                          " (fused_op reduces along the last axis only)")
        self.reduces = True
        return ("reduce", fn, self.expr(node.args[0]))


# ============================================================================ the declaration
class FusedOp:
    """A user-defined fused op; make one with :func:`fused_op`.

    Call it as ``op(h, *arrays_and_scalars, *outputs)`` with any handler,
    stream-group view or DebugHandler ``h``: the arguments in the declared
    order (``inputs``, then ``outputs``).  The call validates its arguments
    like a contract op and issues the work on ``h``'s stream group (or
    records it, inside a capture).  Attributes: ``name``, ``params`` (the
    call's parameters), ``inputs``, ``rows`` (``:row`` inputs), ``cols``
    (``:col`` inputs and outputs, one value per row), ``sums`` (``:row``
    outputs, each a row holding a sum over the rows), ``scalars``,
    ``device_scalars``, ``outputs``, ``full`` (the array of full rows whose
    shape the others follow), ``row_wise`` (whether the body reduces, reads
    ``col`` or has per-row arrays or summed outputs: a row kernel on the
    GPU), ``program`` (the parsed body), ``row`` (the op-table row derived
    from the declaration) and ``digest`` (a hash of the declaration, which
    names its kernels).
    """

    def __init__(self, name, inputs, outputs, body):
        if not isinstance(name, str) or not _NAME.match(name) or keyword.iskeyword(name) \
                or name in optable.METHOD_NAMES:
            fail_value("fused_op", f"name must be an ASCII identifier, got {name!r}")
        self.name = name
        tokens = _tokens(name, "inputs", inputs)
        out_tokens = _tokens(name, "outputs", outputs)
        if not out_tokens:
            fail_value(name, "declares no output")
        arrays, rows, cols, scalars, device, params = [], [], [], [], [], []
        any_format = []
        for tok in tokens:
            kind, n = ("scalar", tok[1:]) if tok[0] in "#$" else ("array", tok)
            if kind == "array" and tok.endswith("^"):
                tok = n = _any_format(name, tok, any_format)
            if kind == "array" and ":" in tok:
                n, mode = tok.split(":", 1)
                if mode not in ("row", "col"):
                    fail_value(name, f"unknown input mode {mode!r} in {tok!r} (only ':row' "
                                     f"or ':col')")
                (rows if mode == "row" else cols).append(n)
            _check_declared(name, n, params)
            params.append(n)
            if kind == "array":
                arrays.append(n)
            else:
                scalars.append(n)
                if tok[0] == "$":
                    device.append(n)
        outputs, sums = [], []
        for tok in out_tokens:
            if tok.endswith("^"):
                tok = _any_format(name, tok, any_format)
            n = tok
            if ":" in tok:
                n, mode = tok.split(":", 1)
                if mode not in ("row", "col"):
                    fail_value(name, f"unknown output mode {mode!r} in {tok!r} (only ':row' "
                                     f"or ':col')")
                (sums if mode == "row" else cols).append(n)
            _check_declared(name, n, params)
            params.append(n)
            outputs.append(n)
        self.inputs, self.rows, self.scalars = tuple(arrays), tuple(rows), tuple(scalars)
        self.device_scalars, self.outputs = tuple(device), tuple(outputs)
        self.cols, self.sums = tuple(cols), tuple(sums)
        self.params = tuple(params)
        self.any_format = tuple(n.split(":")[0] for n in any_format)
        for n in set(self.any_format) & set(self.rows + self.sums):
            fail_value(name, f"{n} is a row (':row') array: only full and per-row (':col') "
                             f"arrays may be of any format ('^')")
        self.program = _Parser(name, arrays, scalars, self.outputs, cols, sums).parse(body)
        # The array whose shape the others follow: the first output of full
        # rows, else the first such input.  It gives the rows and their length.
        full = [p for p in self.outputs + self.inputs
                if p not in self.rows + self.cols + self.sums]
        if not full:
            fail_value(name, "has no input or output of full rows (every array is ':row' or "
                             "':col'): one is needed to give the rows and their length")
        self.full = full[0]
        # Row programs run as a row kernel on the GPU (handlers/cuda/fused_source.py).
        self.row_wise = bool(self.program.reduces or self.program.uses_col or self.cols
                             or self.sums)
        canonical = repr((name, tokens, out_tokens, self.program.statements,
                          self.program.results))
        self.digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
        # The parameters _shapes receives: all but the host scalars.
        self._checked = tuple(p for p in self.params
                              if p not in self.scalars or p in self.device_scalars)
        self.row = self._row()
        self.__doc__ = self.row.doc
        # A fused op's parameters have no defaults: every one is positional or
        # named, after the handler.
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for p in ("h",) + self.params])

    # The methods are made from source at their first use, not at the
    # declaration: a module that declares fused ops (layers.lstm) then runs no
    # generated code when it is imported.
    @functools.cached_property
    def _method(self):
        method = optable._method(self.row, FUSED=self)
        method.__qualname__ = f"FusedOp.{self.name}"
        return method

    @functools.cached_property
    def _checks(self):
        return optable._method(self.row, checks_only=True, FUSED=self)

    @functools.cached_property   # read at every DebugHandler call of the op
    def method_signature(self):
        """The made method's signature (self first): DebugHandler binds calls
        with it."""
        return self.__signature__.replace(parameters=[
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *list(self.__signature__.parameters.values())[1:]])

    def _row(self):
        """The op-table row of the declaration: parameters (outputs whose old
        value the body reads are ``+=``), the aliasing rule (an output may be
        an input's very memory, never a partial overlap of it; outputs must
        not overlap one another nor a device scalar) and the shape rule."""
        tokens = []
        for p in self.params:
            if p in self.scalars:
                tokens.append(("$" if p in self.device_scalars else "#") + p)
            else:
                mark = "^" if p in self.any_format else ""
                if p in self.outputs:
                    mark += "+=" if p in self.program.reads_old else "="
                tokens.append(p + mark)
        ins = ", ".join(self._describe(p) for p in self.params if p not in self.outputs)
        if self.sums:
            outs = (", ".join(o + (" (per row)" if o in self.cols else " (a row: the sum over "
                                   "the rows)" if o in self.sums else "") for o in self.outputs)
                    + "; full rows of one shape" + (", per-row ones of that shape with last "
                                                     "dimension 1" if self.cols else "")
                    + ", summed rows of shape (n,) or (1, n)")
        elif self.cols:
            outs = (", ".join(o + (" (per row)" if o in self.cols else "") for o in self.outputs)
                    + "; full rows of one shape, per-row ones of that shape with last "
                      "dimension 1")
        else:
            outs = f"{', '.join(self.outputs)}, all of one shape"
        doc = (f"Fused op {self.name}: {self.program.text}.\n\n"
               f"Inputs: {ins or 'none'}; outputs: {outs}.  An output "
               f"may be an input (the same memory); a partial overlap, or outputs that "
               f"overlap each other, raise ValueError.")
        if self.sums:
            doc += "  A summed (':row') output must not overlap any input."
        return optable.Op(self.name, " ".join(tokens), exact=self.inputs, shape=self._shapes,
                          call=f"_fused(FUSED, {', '.join(self.params)})", doc=doc)

    def _describe(self, p):
        if p in self.any_format:
            return self._describe_format(p) + ", of any format the handler's class holds"
        return self._describe_format(p)

    def _describe_format(self, p):
        if p in self.rows:
            return f"{p} (a row: shape (n,) or (1, n), broadcast over the last axis)"
        if p in self.cols:
            return f"{p} (one value per row: shape (..., 1))"
        if p in self.device_scalars:
            return f"{p} (a number or a device scalar)"
        if p in self.scalars:
            return f"{p} (a number)"
        return f"{p} (full rows)" if self.cols else f"{p} (the outputs' shape)"

    def _shapes(self, h, *args):
        """The shape rule (called with the parameters but host scalars)."""
        named = dict(zip(self._checked, args))
        name, first = self.name, self.full
        shape = tuple(named[first].shape)
        if self.row_wise and not shape:
            fail_value(name, f"{first} has shape (): a body that reduces or reads 'col', or "
                             f"per-row (':col') arrays, need arrays of at least one dimension")
        if self.program.reduces and shape[-1] == 0:
            fail_value(name, f"{first} {shape} has rows of 0 elements: a reduction over an "
                             f"empty row is undefined")
        per_row = shape[:-1] + (1,)
        for p in self.params:
            if p in self.scalars:
                value = named.get(p, 0.0)
                if type(value) is not float:   # a device scalar: not under any output
                    for o in self.outputs[1:]:   # (check_array_scalar checked the first)
                        if h._overlaps(value, named[o]):
                            fail_value(name, f"{p} must not overlap the output {o}")
                continue
            s = tuple(named[p].shape)
            if p in self.rows or p in self.sums:
                if not shape or not (1 <= len(s) <= len(shape) and s[-1] == shape[-1]
                                     and all(d == 1 for d in s[:-1])):
                    n = shape[-1] if shape else "n"
                    what = ("to broadcast over" if p in self.rows else
                            "to hold the sum over the rows of")
                    fail_value(name, f"row {'input' if p in self.rows else 'output'} {p} must "
                                     f"have shape ({n},) or (1, {n}) {what} {first} {shape}, "
                                     f"got {s}")
            elif p in self.cols:
                if s != per_row:
                    fail_value(name, f"per-row array {p} must have shape {per_row} (one value "
                                     f"per row of {first} {shape}), got {s}")
            elif s != shape:
                fail_value(name, f"shapes differ: {p} {s}, {first} {shape}")
        for o in self.outputs if self.any_format else ():
            # Of another format, an element sits at another offset: an
            # output over an input's memory would overwrite elements that
            # other threads have yet to read.
            for p in self.inputs:
                if named[o].dtype != named[p].dtype and h._overlaps(named[o], named[p]):
                    fail_value(name, f"the output {o} ({named[o].dtype}) must not overlap the "
                                     f"input {p} ({named[p].dtype}): an output may be an "
                                     f"input's memory only in the same format")
        for o in self.sums:
            # A summed output is written after every row has been read (by
            # the GPU's last block): not even an input's very memory may be
            # under it (the table's rule would allow that).  Outputs are
            # disjoint from one another by the table's rule.
            for p in self.inputs:
                if h._overlaps(named[o], named[p]):
                    fail_value(name, f"the summed output {o} must not overlap the input {p}")

    def __call__(self, h, *args, **kwargs):
        run = getattr(h, "_run_fused", None)
        if run is None:
            raise TypeError(f"{self.name}: expected a handler as the first argument, got "
                            f"{type(h).__name__}")
        return run(self, args, kwargs)

    def bind(self, h, *args, **kwargs):
        """A prepared call: check the arguments now, once, and return a
        function of no arguments that runs the op on them each time it is
        called, as ``op(h, *args, **kwargs)`` would, on ``h``'s stream group.

        Arrays keep their memory and shape for life, so checks passed once
        hold for every later call; a number is fixed at bind time (a device
        scalar is read by each run).  On ``PyCudaHandler`` a call is then one
        kernel launch, without the per-call checks that cost more than the
        launch for ops of many arrays (an LSTM step takes 20); ``DebugHandler``
        still checks and tracks every call.  Works inside captures too."""
        bind = getattr(h, "_bind_fused", None)
        if bind is None:
            raise TypeError(f"{self.name}.bind: expected a handler as the first argument, got "
                            f"{type(h).__name__}")
        return bind(self, args, kwargs)

    def __repr__(self):
        return f"<FusedOp {self.name}{self.__signature__}: {self.program.text}>"

    # ------------------------------------------------------------------ NumPy
    def run_numpy(self, h, *args):
        """Compute the op with NumPy on ``h``'s arrays ``args`` (validated, in
        parameter order), in ``h``'s dtype, writing the outputs in place.
        Every value is computed before any output is written, so an output
        that is an input's memory does not change what later statements read
        (as in the kernel, which loads an element's inputs before it stores).
        A summed (``:row``) output gets its value broadcast to the full
        shape and summed over every leading axis (``numpy.sum``, in the
        dtype; zeros when there is no row)."""
        t = h.dtype.type
        shape = args[self.params.index(self.full)].shape
        # Besides the slots: the full shape (reductions broadcast to it
        # first, so that sum(s) of a per-row s is d * s) and col.
        env, given = {"shape": shape}, set()
        if self.program.uses_col:
            env["col"] = np.arange(shape[-1], dtype=t)
        for p, a in zip(self.params, args):
            if p in self.scalars:   # a device scalar is read now, when the op runs
                env[f"sc:{p}"] = t(a if type(a) is float else a.reshape(-1)[0])
                continue
            if p in self.outputs:
                slot, value = f"old:{p}", a
            else:
                slot, value = f"in:{p}", a.reshape(-1) if p in self.rows else a
            if p in self.any_format:   # computed in the handler's format
                value = value.astype(t)
            env[slot] = value
            given.add(id(value))
        with np.errstate(all="ignore"):
            for slot, expr in self.program.statements:
                env[slot] = _evaluate(expr, env, t)
            values = [env[self.program.results[o]] for o in self.outputs]
            if self.sums:
                lead = tuple(range(len(shape) - 1))
                values = [np.sum(np.broadcast_to(v, shape), axis=lead, dtype=t)
                          if o in self.sums else v for o, v in zip(self.outputs, values)]
            # A result that is an argument itself (y = x) is copied before any
            # output is written, in case that output is the argument's memory.
            values = [v.copy() if id(v) in given else v for v in values]
        for o, v in zip(self.outputs, values):
            # An output of another format is rounded once, to nearest even.
            np.copyto(args[self.params.index(o)], v, casting="unsafe")


def _depth(expr):
    """The operations nested in a program expression (0 for a number or a
    name), counted without recursion."""
    deepest, stack = 0, [(expr, 0)]
    while stack:
        e, d = stack.pop()
        if e[0] in ("num", "ref", "col"):
            deepest = max(deepest, d)
        elif e[0] == "ipow":
            stack.append((e[1], d + 1))
        elif e[0] == "reduce":
            stack.append((e[2], d + 1))
        else:
            stack.extend((a, d + 1) for a in e[1:])
    return deepest


def _is_per_row(expr, per_row):
    """Whether ``expr`` has one value per row: it reads only the slots of
    ``per_row``, reductions and numbers (never ``col`` nor an array of full
    rows).  Called on parsed expressions, at most MAX_DEPTH deep."""
    kind = expr[0]
    if kind in ("num", "reduce"):
        return True
    if kind == "col":
        return False
    if kind == "ref":
        return expr[1] in per_row
    if kind == "ipow":
        return _is_per_row(expr[1], per_row)
    return all(_is_per_row(e, per_row) for e in expr[1:])


def _evaluate(expr, env, t):
    kind = expr[0]
    if kind == "num":
        return t(expr[1])
    if kind == "ref":
        return env[expr[1]]
    if kind == "col":
        return env["col"]
    if kind == "ipow":
        return _ipow(_evaluate(expr[1], env, t), expr[2], t)
    if kind == "reduce":
        # Over the full rows: a per-row value or a number is repeated along them.
        value = np.broadcast_to(_evaluate(expr[2], env, t), env["shape"])
        return REDUCE[expr[1]](value, axis=-1, keepdims=True)
    return NUMPY[kind](t, *(_evaluate(e, env, t) for e in expr[1:]))


def _ipow(x, k, t):
    """x ** k for an integer k by squaring: the same products, in the same
    order, as ``sh::fx::ipow`` in kernels/fused.cuh."""
    n = abs(k)
    if n == 0:
        return t(1)
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else result * base
        n >>= 1
        if n:
            base = base * base
    return t(1) / result if k < 0 else result


def _truth(t, cond):
    return np.where(cond, t(1), t(0))


def _erf():
    try:
        from scipy.special import erf
        return lambda t, a: np.asarray(erf(a), dtype=t)
    except ImportError:   # NumPy has no erf ufunc; the math module's, element by element
        one = np.frompyfunc(math.erf, 1, 1)
        return lambda t, a: np.asarray(one(a), dtype=t)


#: The NumPy evaluation of each operation, ``(dtype.type, *operands)``; the
#: operands are arrays or scalars of the dtype, so the arithmetic stays in it.
NUMPY = {
    "add": lambda t, a, b: np.add(a, b), "sub": lambda t, a, b: np.subtract(a, b),
    "mul": lambda t, a, b: np.multiply(a, b), "div": lambda t, a, b: np.divide(a, b),
    "neg": lambda t, a: np.negative(a), "pow": lambda t, a, b: np.power(a, b),
    "lt": lambda t, a, b: _truth(t, a < b), "le": lambda t, a, b: _truth(t, a <= b),
    "gt": lambda t, a, b: _truth(t, a > b), "ge": lambda t, a, b: _truth(t, a >= b),
    "eq": lambda t, a, b: _truth(t, a == b), "ne": lambda t, a, b: _truth(t, a != b),
    "and": lambda t, a, b: _truth(t, (a != 0) & (b != 0)),
    "or": lambda t, a, b: _truth(t, (a != 0) | (b != 0)),
    "not": lambda t, a: _truth(t, a == 0),
    "where": lambda t, c, a, b: np.where(c != 0, a, b).astype(t, copy=False),
    "max": lambda t, a, b: np.maximum(a, b), "min": lambda t, a, b: np.minimum(a, b),
    "exp": lambda t, a: np.exp(a), "expm1": lambda t, a: np.expm1(a),
    "log": lambda t, a: np.log(a), "log1p": lambda t, a: np.log1p(a),
    "sqrt": lambda t, a: np.sqrt(a), "rsqrt": lambda t, a: t(1) / np.sqrt(a),
    "tanh": lambda t, a: np.tanh(a), "abs": lambda t, a: np.abs(a),
    # 1 / (1 + exp(-x)), as the kernel: exp overflows to inf and gives 0, never NaN.
    "sigmoid": lambda t, a: t(1) / (t(1) + np.exp(np.negative(a))),
    "erf": _erf(),
}


#: The NumPy reductions along the last axis, in the operands' dtype (np.max
#: and np.min propagate NaN; np.mean divides the sum by the row's length).
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _tokens(op, what, spec):
    if isinstance(spec, str):
        return spec.replace(",", " ").split()
    if isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec):
        return [t for s in spec for t in s.replace(",", " ").split()]
    fail_value(op, f"{what} must be a str of names (or a list of them), got {spec!r}")


def _any_format(op, tok, seen):
    """``tok`` without its trailing ``^`` (an array of any format), noted
    in ``seen``."""
    bare = tok[:-1]
    if not bare or bare.endswith("^"):
        fail_value(op, f"{tok!r}: '^' follows an array's name (or its mode) once")
    seen.append(bare)
    return bare


def _check_declared(op, name, seen):
    if not _NAME.match(name) or keyword.iskeyword(name) or name in RESERVED \
            or name in optable.METHOD_NAMES:
        fail_value(op, f"{name!r} cannot name a parameter (a function name, a reserved name "
                       f"or not an ASCII identifier)")
    if name in seen:
        fail_value(op, f"{name!r} is declared twice")


def fused_op(name, inputs, outputs, body):
    """Declare a fused op (elementwise, or row by row with reductions along
    the last axis) and return it as a :class:`FusedOp`.

    Args:
        name: an identifier; it names the op in errors and its kernels.
        inputs: the op's inputs in call order, a str of tokens separated by
            spaces or commas: ``x`` an array of the outputs' shape, ``b:row``
            an array of shape (n,) or (1, n) broadcast along the last axis of
            outputs whose last dimension is n (a bias), ``t:col`` an array
            of one value per row, shape (..., 1), broadcast along the rows
            (a class target, a per-row scale), ``#s`` a real number
            (fixed when a capture records the call) and ``$s`` a real number
            or a device scalar (a one-element array of the handler, read when
            the op runs, so a replayed graph sees its current value).  A
            trailing ``^`` (``x^``, ``t:col^``) lets a full or per-row array
            be of any format the handler's class holds (an array of a twin,
            ``Handler.twin``): the op computes in the handler's format and
            widens or rounds its values as it loads them.
        outputs: the output names, after the inputs in the call: ``y`` of
            full rows, ``loss:col`` one value per row, shape (..., 1),
            ``db:row`` a row of shape (n,) or (1, n) holding the sum over
            all rows of the value assigned (a gain's or a bias's gradient).
            ``y^`` (or ``loss:col^``): of any format, the value rounded once
            into it as it is stored.
        body: assignments computing every output (see the module docstring
            for the language, reductions along the last axis included).

    Raises ValueError naming the op (and the line and column in the body)
    for an unknown name or function, unsupported syntax, an output never
    assigned, an input never read, an assignment to an input, a reduction
    along another axis, a per-row output assigned a value that varies
    along the row or a summed (``:row``) output whose old contents the body
    reads.

    The op computes on NumPy with ufuncs (and ``numpy.sum``, ``mean``,
    ``max``, ``min`` along the last axis) in the handler's dtype and on a GPU
    with one generated kernel per declaration and dtype (and per format of
    each ``^`` array that differs from the handler's), compiled once per
    process (and cached on disk by pycuda).
    """
    return FusedOp(name, inputs, outputs, body)
