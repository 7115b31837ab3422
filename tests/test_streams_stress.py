"""Randomized stream-schedule stress test.

Each *program* is a random sequence of steps over a small pool of arrays: first
every array is uploaded (``set_from_numpy``), then 20-40 ops (dot products,
elementwise ops, activations, reductions, broadcasts, copies, fills...), each
step on a random stream group in ``range(4)``.  While generating, a dependency
tracker inserts the ordering the contract requires between groups and nothing
more: before a step on group g, for every array it reads whose last writer ran
on another group, and every array it writes whose last writer or readers since
ran on another group, and only if that work is not already ordered before g, it
inserts one of ``wait_event`` (on an event recorded right after the producing
step), ``wait_for``, ``synchronize`` on the producer's group or, rarely,
``synchronize_all_streams``.  Steps that touch disjoint arrays stay unordered, so
on a GPU they may overlap.

The program runs twice on the same arrays and the same initial data: once with
its schedule over four groups and once with every step on the plain handler
(group 0, no waits).  Every final array must be equal bit for bit.  That is a
valid requirement because each op's result does not depend on the stream it runs
on (kernels and cuBLAS are deterministic for a given shape, reductions have a
fixed order, each group has its own workspace), so only a missing or broken
ordering can change a result.  Values stay bounded (ops that can grow magnitudes
are followed by a scale, ``tanh`` or ``clip_t`` in the same step) and the
reference results are checked to be finite, so NaN cannot mask a difference.

Programs also hold *stalls*: on asynchronous handlers, a large ``dot_mm`` on
private arrays right before a step holds that step's group back, so that the
other groups run ahead of it.  Without them a GPU runs these small ops one at a
time anyway (host launch costs more than the kernels), and a missing wait would
go unseen: on an H200, 40 of 40 programs run *without* their waits differed from
the serial run with stalls, 0 of 40 without.

Besides the comparison:

* ``find_races`` replays a program's schedule as a happens-before graph, built
  independently of the generator's bookkeeping, and reports every conflicting
  pair of accesses (read/write or write/write of one array) that the schedule
  leaves unordered.  Every generated program must be race-free, and a program
  with its waits removed must not be: that is how a deliberately broken
  schedule is caught on any machine.
* On ``NumpyHandler`` every op runs at once, which is a valid schedule, so a
  missing wait cannot change a result there: on the CPU the comparison only
  proves that views and the ordering calls compute what the plain handler
  computes.  The test has teeth on a truly asynchronous handler
  (``PyCudaHandler``), where ops on different groups overlap and a missing or
  ineffective wait gives stale or half-written inputs: run it on the GPU.
  There, ``test_missing_waits_are_caught`` drops every wait and checks that
  the comparison fails for most programs.

A failure prints the program seed and the program listing (steps, events, waits
and stalls).  To rerun one program::

    from test_streams_stress import make_program, check_program, make_stalls
    check_program(handler, make_program(SEED),
                  stalls=make_stalls(handler, np.random.default_rng(0)))
"""
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from handlers import NumpyHandler
from helpers import rand

GROUPS = 4
PROGRAMS = 200          # per handler configuration, split into CHUNKS test items
CHUNKS = 4
STEPS = (20, 40)        # number of op steps per program (inclusive range)

#: The arrays of every program, in upload order.
POOL = {
    "X0": (64, 96), "X1": (64, 96), "X2": (64, 96), "X3": (64, 96),
    "W": (96, 64), "S0": (64, 64), "S1": (64, 64), "R": (1, 96), "C": (64, 1),
}

#: How a missing ordering is supplied: kind -> weight.  wait_event is the
#: minimal one (orders only up to the producing step); the others order more.
SYNC_WEIGHTS = {"wait_event": 0.58, "wait_for": 0.25, "synchronize": 0.13,
                "synchronize_all": 0.04}

#: Probability that a step runs on the group of the last writer of one of its
#: arrays (chains of dependent steps), instead of a uniformly random group.
AFFINITY = 0.5

#: Probability of a stall (see ``Stall``) right before an op step, on its group.
STALL_P = 0.2
STALL_N = 2048


# ---------------------------------------------------------------------- programs
class Init:
    """Placeholder for an array's initial host data in a ``set_from_numpy`` call."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"init[{self.name}]"


@dataclass
class Step:
    """Handler calls run back to back on one group.

    ``calls`` are (method, args, kwargs); array arguments are pool names (str).
    ``writes`` is the array the step writes; ``reads`` the others it uses.
    """
    index: int
    group: int
    calls: list
    reads: frozenset
    writes: frozenset

    def listing(self):
        return "; ".join(_format_call(*c) for c in self.calls)


@dataclass
class Sync:
    """An ordering call.  kind: wait_event (group waits for the event recorded
    after step ``step``), wait_for (group waits for group ``other``),
    synchronize (host waits for group ``other``), synchronize_all."""
    kind: str
    group: int = 0
    other: int = 0
    step: int = 0

    def listing(self):
        if self.kind == "wait_event":
            return f"g{self.group}.wait_event(ev{self.step})"
        if self.kind == "wait_for":
            return f"g{self.group}.wait_for(g{self.other})"
        if self.kind == "synchronize":
            return f"g{self.other}.synchronize()"
        return "synchronize_all_streams()"


@dataclass
class Stall:
    """A long op on ``group`` over private arrays (``dot_mm`` of two
    STALL_N x STALL_N matrices), run on asynchronous handlers only: it holds
    the group back so that the other groups run ahead of it, which makes a
    missing wait show up.  It touches no pool array, so it needs no ordering."""
    group: int

    def listing(self):
        return f"g{self.group}.stall()"


@dataclass
class Program:
    seed: int
    items: list                          # Step, Sync and Stall, in issue order
    record_after: set                    # steps followed by record_event()
    init: dict = field(repr=False)       # name -> float64 host data

    @property
    def steps(self):
        return [it for it in self.items if isinstance(it, Step)]

    @property
    def syncs(self):
        return [it for it in self.items if isinstance(it, Sync)]

    def listing(self):
        shapes = ", ".join(f"{n} {s}" for n, s in POOL.items())
        lines = [(f"program seed {self.seed}: arrays {shapes}; init[name] = "
                  f"helpers.rand(shape, np.random.default_rng(seed)) in that order; "
                  f"gK = handler.with_streams(K); gK.stall(): a {STALL_N}x{STALL_N} "
                  f"dot_mm on group K (asynchronous handlers only)")]
        for it in self.items:
            if isinstance(it, Step):
                line = f"  s{it.index:<3d} g{it.group}: {it.listing()}"
                if it.index in self.record_after:
                    line += f"   ->  ev{it.index} = g{it.group}.record_event()"
            else:
                line = f"          {it.listing()}"
            lines.append(line)
        return "\n".join(lines)


def _format_call(method, args, kwargs):
    parts = [a if isinstance(a, str) else repr(a) for a in args]
    parts += [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{method}({', '.join(parts)})"


def _dot_candidates():
    """Every (a, transa, b, transb, out, k) of pool arrays a dot can use,
    with out different from a and b."""
    found = []
    for out, (m, n) in POOL.items():
        for a, sa in POOL.items():
            for ta in (False, True):
                m_a, k = sa[::-1] if ta else sa
                if m_a != m or a == out:
                    continue
                for b, sb in POOL.items():
                    for tb in (False, True):
                        if (sb[::-1] if tb else sb) == (k, n) and b != out:
                            found.append((a, ta, b, tb, out, k))
    return found


DOT_CANDIDATES = _dot_candidates()
#: (a, axis, out) for sum_t: out has the sum's shape with the axis kept as 1.
SUM_CANDIDATES = [(a, axis, out) for a, sa in POOL.items() for axis in (0, 1)
                  for out, so in POOL.items()
                  if out != a and so == tuple(1 if i == axis else d for i, d in enumerate(sa))]
#: (a, axis, out) for broadcast_t: a has out's shape with a 1 at axis.
BROADCAST_CANDIDATES = [(a, axis, out) for out, so in POOL.items() for axis in (0, 1)
                        for a, sa in POOL.items()
                        if a != out and so[axis] != 1
                        and sa == tuple(1 if i == axis else d for i, d in enumerate(so))]
#: (m, v) for the matrix-vector ops: v is (1, cols) or (rows, 1).
MV_CANDIDATES = [(m, v) for m, (r, c) in POOL.items() if r > 1 and c > 1
                 for v, sv in POOL.items() if sv in ((1, c), (r, 1))]


class _Generator:
    """Builds one random program; see the module docstring."""

    def __init__(self, seed):
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.items = []
        self.record_after = set()
        self.nsteps = 0
        # clock[g][h]: the steps of group h up to this index are ordered before
        # work issued from now on on group g (-1: none).
        self.clock = [[-1] * GROUPS for _ in range(GROUPS)]
        self.last = [-1] * GROUPS          # last step issued on each group
        self.after = {}                    # step -> clock of its group right after it
        self.group_of = {}                 # step -> group
        self.writer = dict.fromkeys(POOL)  # array -> step that last wrote it
        self.readers = {n: [] for n in POOL}   # array -> steps that read it since

    # random helpers -----------------------------------------------------------
    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def scalar(self, low, high):
        """A random scalar, rounded so that the listing shows it exactly."""
        while True:
            s = round(float(self.rng.uniform(low, high)), 3)
            if s != 0.0:
                return s

    def names(self, shape=None):
        return [n for n, s in POOL.items() if shape is None or s == shape]

    def same_shape(self, k):
        """k names (repeats allowed) of one random shape."""
        shape = POOL[self.choice(self.names())]
        return [self.choice(self.names(shape)) for _ in range(k)]

    # ops -----------------------------------------------------------------------
    # Each returns (calls, written array).  Inputs are in [-2, 2]; every op keeps
    # its output there (or close), so nothing can overflow.
    def op_dot(self, accumulate):
        a, ta, b, tb, out, k = self.choice(DOT_CANDIDATES)
        kw = {k_: v for k_, v in (("transa", ta), ("transb", tb)) if v}
        name = "dot_add_mm" if accumulate else "dot_mm"
        scale = round(1.0 / math.sqrt(k), 4)
        return [(name, (a, b, out), kw), ("mult_st", (scale, out, out), {}),
                ("tanh", (out, out), {})], out

    def op_axpby(self):
        x, y = self.same_shape(2)
        alpha, beta = self.scalar(-1, 1), self.scalar(-1, 1)
        norm = abs(alpha) + abs(beta)
        if norm > 1:
            alpha, beta = round(alpha / norm, 3) or 0.001, round(beta / norm, 3) or 0.001
        if self.rng.random() < 0.1:
            beta = 0.0
        return [("axpby", (alpha, x, beta, y), {})], y

    def op_binary(self):
        a, b, out = self.same_shape(3)
        name = self.choice(["add_tt", "subtract_tt", "mult_tt", "mult_add_tt"])
        if name in ("add_tt", "subtract_tt"):
            post = ("mult_st", (0.5, out, out), {})
        else:
            post = ("clip_t", (out, -2.0, 2.0, out), {})
        return [(name, (a, b, out), {}), post], out

    def op_scalar(self):
        t, out = self.same_shape(2)
        name = self.choice(["add_st", "mult_st", "mult_add_st"])
        return [(name, (self.scalar(-1.5, 1.5), t, out), {}),
                ("clip_t", (out, -2.0, 2.0, out), {})], out

    def op_unary(self):
        a, out = self.same_shape(2)
        name = self.choice(["sigmoid", "tanh", "relu", "elu", "abs_t", "exp_t", "sqrt_t"])
        if name == "exp_t":
            return [("exp_t", (a, out), {}), ("mult_st", (0.25, out, out), {})], out
        if name == "sqrt_t":
            return [("abs_t", (a, out), {}), ("sqrt_t", (out, out), {})], out
        return [(name, (a, out), {})], out

    def op_clip(self):
        a, out = self.same_shape(2)
        lo = self.scalar(-2, 1)
        hi = round(lo + float(self.rng.uniform(0.5, 2 - lo)), 3)
        return [("clip_t", (a, lo, hi, out), {})], out

    def op_mv(self):
        m, v = self.choice(MV_CANDIDATES)
        out = self.choice([m, m] + self.names(POOL[m]))
        name = self.choice(["add_mv", "subtract_mv", "mult_mv"])
        post = (("mult_st", (0.5, out, out), {}) if name != "mult_mv"
                else ("clip_t", (out, -2.0, 2.0, out), {}))
        return [(name, (m, v, out), {}), post], out

    def op_sum(self):
        a, axis, out = self.choice(SUM_CANDIDATES)
        n = POOL[a][axis]
        axis = self.choice([axis, axis - 2])          # negative axes too
        return [("sum_t", (a, axis, out), {}),
                ("mult_st", (round(1.0 / n, 6), out, out), {})], out

    def op_broadcast(self):
        a, axis, out = self.choice(BROADCAST_CANDIDATES)
        return [("broadcast_t", (a, self.choice([axis, axis - 2]), out), {})], out

    def op_copy(self):
        while True:
            src, dest = self.same_shape(2)
            if src != dest:
                return [("copy_to", (src, dest), {})], dest

    def op_fill(self):
        a = self.choice(self.names())
        return [("fill", (a, self.scalar(-2, 2)), {})], a

    def op_softmax(self):
        shape = POOL[self.choice(["X0", "W", "S0"])]
        m, out = self.choice(self.names(shape)), self.choice(self.names(shape))
        return [("softmax_m", (m, out), {})], out

    def op_deriv(self):
        x, y, dy, dx = self.same_shape(4)
        name = self.choice(["sigmoid_deriv", "tanh_deriv", "relu_deriv"])
        return [(name, (x, y, dy, dx), {}), ("clip_t", (dx, -2.0, 2.0, dx), {})], dx

    def op_masked(self):
        src, dest, cond = self.same_shape(3)
        name = self.choice(["copy_to_if", "add_into_if", "fill_if"])
        if name == "fill_if":
            return [("fill_if", (dest, self.scalar(-2, 2), cond), {})], dest
        return [(name, (src, dest, cond), {}), ("clip_t", (dest, -2.0, 2.0, dest), {})], dest

    OPS = (  # (weight, builder)
        (4, lambda g: g.op_dot(False)),
        (3, lambda g: g.op_dot(True)),
        (2, lambda g: g.op_axpby()),
        (3, lambda g: g.op_binary()),
        (2, lambda g: g.op_scalar()),
        (3, lambda g: g.op_unary()),
        (1, lambda g: g.op_clip()),
        (2, lambda g: g.op_mv()),
        (2, lambda g: g.op_sum()),
        (1, lambda g: g.op_broadcast()),
        (1, lambda g: g.op_copy()),
        (1, lambda g: g.op_fill()),
        (1, lambda g: g.op_softmax()),
        (1, lambda g: g.op_deriv()),
        (1, lambda g: g.op_masked()),
    )

    # scheduling ------------------------------------------------------------------
    def clock_now(self, h):
        """What finishing all work issued so far on group h implies."""
        c = list(self.clock[h])
        c[h] = self.last[h]
        return c

    def merge(self, g, c):
        self.clock[g] = [max(x, y) for x, y in zip(self.clock[g], c)]

    def order_before(self, g, h, step):
        """Insert an ordering call so that work issued next on group g runs
        after ``step`` (issued on group h)."""
        kinds = list(SYNC_WEIGHTS)
        kind = kinds[int(self.rng.choice(len(kinds), p=list(SYNC_WEIGHTS.values())))]
        if kind == "wait_event":
            self.record_after.add(step)
            self.merge(g, self.after[step])
            self.items.append(Sync("wait_event", group=g, step=step))
        elif kind == "wait_for":
            self.merge(g, self.clock_now(h))
            self.items.append(Sync("wait_for", group=g, other=h))
        elif kind == "synchronize":
            done = self.clock_now(h)
            for x in range(GROUPS):
                self.merge(x, done)
            self.items.append(Sync("synchronize", other=h))
        else:
            done = [max(c) for c in zip(*(self.clock_now(h) for h in range(GROUPS)))]
            for x in range(GROUPS):
                self.merge(x, done)
            self.items.append(Sync("synchronize_all"))

    def issue(self, group, calls, writes, may_stall=True):
        s = self.nsteps
        used = {a for _, args, _ in calls for a in args if isinstance(a, str)}
        writes = frozenset(writes)
        reads = frozenset(used - writes)
        # The last step of each other group that must finish before this one.
        need = {}
        for a in used:
            deps = [self.writer[a]] if self.writer[a] is not None else []
            if a in writes:
                deps += self.readers[a]
            for d in deps:
                h = self.group_of[d]
                if h != group:
                    need[h] = max(need.get(h, -1), d)
        for h in self.rng.permutation(sorted(need)):
            h = int(h)
            if self.clock[group][h] < need[h]:       # not already ordered
                self.order_before(group, h, need[h])
        if may_stall and self.rng.random() < STALL_P:
            self.items.append(Stall(group))
        self.items.append(Step(s, group, calls, reads, writes))
        self.nsteps += 1
        self.last[group] = s
        self.clock[group][group] = s
        self.after[s] = list(self.clock[group])
        self.group_of[s] = group
        for a in reads:
            self.readers[a].append(s)
        for a in writes:
            self.writer[a] = s
            self.readers[a] = []

    def pick_group(self, arrays):
        written = [self.writer[a] for a in arrays if self.writer[a] is not None]
        if written and self.rng.random() < AFFINITY:
            return self.group_of[self.choice(written)]
        return int(self.rng.integers(GROUPS))

    def build(self):
        data_rng = np.random.default_rng(self.seed)
        init = {name: rand(shape, data_rng) for name, shape in POOL.items()}
        for name in POOL:
            self.issue(int(self.rng.integers(GROUPS)),
                       [("set_from_numpy", (name, Init(name)), {})], [name], may_stall=False)
        weights = np.array([w for w, _ in self.OPS], dtype=float)
        for _ in range(int(self.rng.integers(STEPS[0], STEPS[1] + 1))):
            _, build = self.OPS[int(self.rng.choice(len(self.OPS), p=weights / weights.sum()))]
            calls, out = build(self)
            used = [a for _, args, _ in calls for a in args if isinstance(a, str)]
            self.issue(self.pick_group(used), calls, [out])
        return Program(self.seed, self.items, self.record_after, init)


def make_program(seed):
    """The random program of ``seed`` (deterministic, handler-independent)."""
    return _Generator(seed).build()


# ---------------------------------------------------------------------- race check
def happens_before(program):
    """For each step, the set of steps that the schedule orders before it.

    Independent of the generator's clocks: builds the happens-before graph of
    the CUDA stream model.  Nodes are steps, waits and host synchronisations;
    a stream node follows the previous node of its group and the last host
    synchronisation; ``wait_event`` also follows the node the event was recorded
    after, ``wait_for`` the current last node of the other group; a host
    ``synchronize`` follows the last node of its group(s) and the previous host
    synchronisation.  Ancestor sets are bitsets (ints) over nodes.
    """
    ancestors = []                      # node -> bitset of nodes before it
    tail = [None] * GROUPS              # last stream node of each group
    host = None                         # last host synchronisation node
    events = {}                         # step -> node its event was recorded after
    step_node = {}

    def node(*preds):
        bits = 0
        for p in preds:
            if p is not None:
                bits |= ancestors[p] | (1 << p)
        ancestors.append(bits)
        return len(ancestors) - 1

    def stream_node(g, *extra):
        tail[g] = node(tail[g], host, *extra)
        return tail[g]

    for it in program.items:
        if isinstance(it, Stall):
            continue                    # touches no pool array
        if isinstance(it, Step):
            step_node[it.index] = stream_node(it.group)
            if it.index in program.record_after:
                events[it.index] = tail[it.group]
        elif it.kind == "wait_event":
            assert it.step in events, f"ev{it.step} waited on before it was recorded"
            stream_node(it.group, events[it.step])
        elif it.kind == "wait_for":
            stream_node(it.group, tail[it.other])
        elif it.kind == "synchronize":
            host = node(host, tail[it.other])
        else:
            host = node(host, *tail)
    return {s: {t for t, n in step_node.items() if ancestors[m] >> n & 1}
            for s, m in step_node.items()}


def find_races(program):
    """Conflicting step pairs (earlier, later, array) left unordered."""
    before = happens_before(program)
    steps = program.steps
    races = []
    for j, later in enumerate(steps):
        for earlier in steps[:j]:
            for a in sorted((earlier.reads | earlier.writes) & (later.reads | later.writes)):
                if (a in earlier.writes or a in later.writes) \
                        and earlier.index not in before[later.index]:
                    races.append((earlier.index, later.index, a))
    return races


# ---------------------------------------------------------------------- running
def allocate_pool(handler):
    return {name: handler.allocate(shape) for name, shape in POOL.items()}


def make_stalls(handler, rng):
    """Arrays for ``Stall`` items: None on NumpyHandler, whose ops run at once
    (a stall would only cost time), else a shared input and one output per group."""
    if isinstance(handler, NumpyHandler):
        return None
    big = handler.create_from_numpy(rand((STALL_N, STALL_N), rng))
    return big, [handler.allocate((STALL_N, STALL_N)) for _ in range(GROUPS)]


def run_program(handler, arrays, program, serial, stalls=None, ordered=True):
    """Run ``program`` on ``arrays``; return host copies of all arrays.

    serial=False: each step on its group, with the program's events and waits
    (and its stalls, given ``stalls`` from ``make_stalls``).
    serial=True: every step on the plain handler (group 0), no ordering calls.
    ordered=False drops the ordering calls: a deliberately broken schedule.
    """
    host = {name: np.asarray(data, dtype=handler.dtype) for name, data in program.init.items()}
    # The previous run may still read the arrays on any group, and the uploads
    # below are ordered only with their own group: finish everything first.
    handler.synchronize_all_streams()
    views = [handler.with_streams(k) for k in range(GROUPS)]
    events = {}

    def value(a):
        if isinstance(a, Init):
            return host[a.name]
        return arrays[a] if isinstance(a, str) else a

    for it in program.items:
        if isinstance(it, Step):
            h = handler if serial else views[it.group]
            for method, args, kwargs in it.calls:
                getattr(h, method)(*map(value, args), **kwargs)
            if not serial and it.index in program.record_after:
                events[it.index] = h.record_event()
        elif serial:
            continue
        elif isinstance(it, Stall):
            if stalls is not None:
                big, outs = stalls
                views[it.group].dot_mm(big, big, outs[it.group])
        elif not ordered:
            continue
        elif it.kind == "wait_event":
            views[it.group].wait_event(events[it.step])
        elif it.kind == "wait_for":
            views[it.group].wait_for(views[it.other])
        elif it.kind == "synchronize":
            views[it.other].synchronize()
        else:
            handler.synchronize_all_streams()
    # get_numpy_copy includes the work of every group.
    return {name: handler.get_numpy_copy(a) for name, a in arrays.items()}


def differences(got, want):
    """Readable differences between two runs' results ([] if bit for bit equal)."""
    problems = []
    for name in POOL:
        if not np.isfinite(want[name]).all():
            problems.append(f"{name}: the serial result is not finite (generator bug)")
        elif not np.array_equal(got[name], want[name]):
            differ = got[name] != want[name]
            diff = np.abs(got[name] - want[name])[differ]
            finite = diff[np.isfinite(diff)]
            problems.append(f"{name}: {differ.sum()} of {differ.size} elements differ, "
                            f"{diff.size - finite.size} of them non-finite"
                            + (f", max |diff| {finite.max():.3g}" if finite.size else ""))
    return problems


def check_program(handler, program, arrays=None, stalls=None):
    """Run ``program`` scheduled and serially; fail with its listing on a difference."""
    if arrays is None:
        arrays = allocate_pool(handler)
    races = find_races(program)
    if races:
        pytest.fail(f"the generator produced a racy schedule: {races[:10]}\n"
                    f"{program.listing()}", pytrace=False)
    got = run_program(handler, arrays, program, serial=False, stalls=stalls)
    want = run_program(handler, arrays, program, serial=True)
    problems = differences(got, want)
    if problems:
        pytest.fail(f"{handler!r}: the scheduled run differs from the serial run "
                    f"(program seed {program.seed}):\n  " + "\n  ".join(problems)
                    + f"\nrerun: check_program(handler, make_program({program.seed}), "
                    "stalls=make_stalls(handler, np.random.default_rng(0))) "
                    "from tests/test_streams_stress.py\n"
                    + program.listing(), pytrace=False)


def program_seeds(rng, n):
    return [int(s) for s in rng.integers(0, 2**63, size=n)]


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_match_serial_run(handler, rng, chunk):
    if handler.num_stream_groups < GROUPS:
        pytest.skip(f"needs {GROUPS} stream groups, handler has {handler.num_stream_groups}")
    arrays = allocate_pool(handler)     # once: every program re-uploads its data
    stalls = make_stalls(handler, rng)
    for seed in program_seeds(rng, PROGRAMS // CHUNKS):
        check_program(handler, make_program(seed), arrays, stalls)


def test_missing_waits_are_caught(handler, rng):
    """The stress test has teeth: with its ordering calls dropped, programs give
    results that differ from the serial run."""
    if isinstance(handler, NumpyHandler):
        pytest.skip("NumpyHandler runs ops at once, a valid schedule without any "
                    "wait: a missing wait cannot change a result")
    if handler.num_stream_groups < GROUPS:
        pytest.skip(f"needs {GROUPS} stream groups, handler has {handler.num_stream_groups}")
    arrays, stalls = allocate_pool(handler), make_stalls(handler, rng)
    seeds = program_seeds(rng, 20)
    caught = [seed for seed in seeds
              if differences(run_program(handler, arrays, make_program(seed), serial=False,
                                         stalls=stalls, ordered=False),
                             run_program(handler, arrays, make_program(seed), serial=True))]
    # On an H200 every one of 40 such programs differed (and none without stalls).
    assert len(caught) >= len(seeds) // 4, (
        f"only {len(caught)} of {len(seeds)} programs run without their waits differed "
        "from the serial run: the stress test hardly sees a missing wait here")


def _stats(programs):
    steps = [s for p in programs for s in p.steps]
    syncs = [s for p in programs for s in p.syncs]
    kinds = {k: sum(s.kind == k for s in syncs) for k in SYNC_WEIGHTS}
    # Op steps that the schedule leaves unordered with some earlier step of
    # another group: on a GPU they may run at the same time as that step.
    concurrent = unordered_pairs = 0
    for p in programs:
        before = happens_before(p)
        ps = p.steps
        for j, later in enumerate(ps[len(POOL):], start=len(POOL)):
            free = sum(e.group != later.group and e.index not in before[later.index]
                       for e in ps[:j])
            unordered_pairs += free
            concurrent += free > 0
    return {"programs": len(programs), "steps": len(steps),
            "op_steps": len(steps) - len(POOL) * len(programs),
            "stalls": sum(isinstance(it, Stall) for p in programs for it in p.items),
            "steps_off_group_0": sum(s.group != 0 for s in steps),
            "syncs": len(syncs), **kinds, "events_recorded":
            sum(len(p.record_after) for p in programs),
            "steps_concurrent_with_an_earlier_step": concurrent,
            "unordered_cross_group_pairs": unordered_pairs}


def test_generator_makes_cross_group_dependencies_and_independent_steps(rng):
    programs = [make_program(s) for s in program_seeds(rng, PROGRAMS)]
    st = _stats(programs)
    info = f"generator statistics: {st}"
    n = st["steps"]
    assert all(STEPS[0] + len(POOL) <= len(p.steps) <= STEPS[1] + len(POOL)
               for p in programs), info
    assert st["steps_off_group_0"] > 0.6 * n, info
    # Many orderings are needed, and every kind of ordering call is exercised.
    assert st["syncs"] > 0.2 * n, info
    for kind in SYNC_WEIGHTS:
        assert st[kind] >= (5 if kind == "synchronize_all" else 50), info
    # ...but the schedule stays far from serial: many steps may overlap.
    assert st["syncs"] < 0.8 * n, info
    assert st["steps_concurrent_with_an_earlier_step"] > 0.5 * st["op_steps"], info
    assert st["stalls"] > 0.1 * st["op_steps"], info
    # Every program needs some ordering.
    assert all(p.syncs for p in programs), info


def test_schedules_are_race_free_and_broken_ones_are_caught(rng):
    programs = [make_program(s) for s in program_seeds(rng, PROGRAMS)]
    single_drop_caught = 0
    for p in programs:
        assert find_races(p) == [], p.listing()
        # Without any ordering call, the program must race.
        bare = Program(p.seed, p.steps, set(), p.init)
        assert find_races(bare), p.listing()
        # Dropping one random ordering call usually races too (the waits are
        # minimal-ish; a dropped one can be covered by a later transitive one).
        syncs = [i for i, it in enumerate(p.items) if isinstance(it, Sync)]
        drop = syncs[int(rng.integers(len(syncs)))]
        broken = Program(p.seed, p.items[:drop] + p.items[drop + 1:], p.record_after, p.init)
        single_drop_caught += bool(find_races(broken))
    assert single_drop_caught > 0.8 * len(programs), \
        f"only {single_drop_caught} of {len(programs)} single-wait drops made a race"


def test_race_check_sees_each_ordering_kind():
    """Hand-written schedules: a producer on g1 and a consumer on g2."""
    def prog(*syncs, record=()):
        items = [Step(0, 1, [], frozenset(), frozenset({"X0"})), *syncs,
                 Step(1, 2, [], frozenset({"X0"}), frozenset({"X1"}))]
        return Program(0, items, set(record), {})

    assert find_races(prog()) == [(0, 1, "X0")]
    assert find_races(prog(Sync("wait_event", group=2, step=0), record=[0])) == []
    assert find_races(prog(Sync("wait_event", group=3, step=0), record=[0])) != []
    assert find_races(prog(Sync("wait_for", group=2, other=1))) == []
    assert find_races(prog(Sync("wait_for", group=2, other=3))) != []
    assert find_races(prog(Sync("synchronize", other=1))) == []
    assert find_races(prog(Sync("synchronize", other=2))) != []
    assert find_races(prog(Sync("synchronize_all"))) == []
    # Transitive: g3 waits for g1, then g2 waits for g3.
    assert find_races(prog(Sync("wait_for", group=3, other=1),
                           Sync("wait_for", group=2, other=3))) == []
    # An event recorded on g1 *before* the write does not cover it.
    early = Program(0, [Step(0, 1, [], frozenset({"X2"}), frozenset({"X3"})),
                        Step(1, 1, [], frozenset(), frozenset({"X0"})),
                        Sync("wait_event", group=2, step=0),
                        Step(2, 2, [], frozenset({"X0"}), frozenset({"X1"}))], {0}, {})
    assert find_races(early) == [(1, 2, "X0")]
