"""DebugHandler: same results as the wrapped handler, plus aliasing, NaN/Inf and
cross-group hazard checks.

Every test wraps the ``handler`` fixture (NumpyHandler here; PyCudaHandler
configurations run the same tests where a GPU is available).  NumpyHandler runs
ops at once, but the tracker follows the contract, not the schedule, so a
missing wait is reported on the CPU exactly as it would be on the GPU.
"""
import gc
import inspect

import numpy as np
import pytest

import handlers
from handlers import DebugHandler, Handler, StreamHazardError
from handlers.debug_handler import OPS, DebugEvent, byte_range
from handlers.optable import ELEMENTWISE
from helpers import assert_close, rand
from test_streams_api import workload
from test_validation import CASES, OPS_BY_NAME, Call, method

R, C = 5, 7
S = (R, C)
STREAM_OPS = {"with_streams", "record_event", "wait_event", "wait_for", "synchronize",
              "synchronize_all_streams", "capture", "close",
              "twin",   # graphs: test_graphs.py; twin: test_twin.py
              "random_state", "set_random_state"}   # host state: test_checkpoint.py
ALLOC_OPS = {"allocate", "zeros", "ones", "create_from_numpy", "create_from_device_array"}
VIEW_OPS = {"reshape_t", "view_t"}   # no work: test_ops.py, and the hazard test below
HAZARD_KINDS = ["read-after-write", "write-after-read", "write-after-write"]


def public_ops():
    """Every public op of the Handler contract, from the class itself."""
    return {name for name, value in vars(Handler).items()
            if callable(value) and not name.startswith("_")}


def need_groups(handler, n):
    if handler.num_stream_groups < n:
        pytest.skip(f"needs {n} stream groups, handler has {handler.num_stream_groups}")


def groups_one_two(handler):
    """A DebugHandler of ``handler`` and its views of stream groups 1 and 2
    (skips unless the handler has 3 groups)."""
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    return debug, debug.with_streams(1), debug.with_streams(2)


def view_of(h, flat, lo, hi, shape=None):
    """Elements [lo, hi) of the contiguous handler array ``flat`` as a view of
    ``shape`` (default: 1-D), through the contract's own view op (every
    handler has it: a failure here is a failure)."""
    shape = (hi - lo,) if shape is None else shape
    assert hi - lo == int(np.prod(shape)), (lo, hi, shape)
    return h.view_t(flat, lo, shape)


# ============================================================================ the op table
def test_op_table_covers_every_public_op():
    ops = public_ops()
    assert set(OPS) == ops, (f"missing from OPS: {sorted(ops - set(OPS))}; "
                             f"not ops of Handler: {sorted(set(OPS) - ops)}")
    for name, spec in OPS.items():
        params = inspect.signature(getattr(Handler, name)).parameters
        for arg in (spec.reads + spec.writes + spec.unused + spec.disjoint
                    + tuple(spec.unread_if)):
            assert arg in params, f"OPS[{name!r}] names {arg!r}, not an argument of {name}"
        assert set(spec.disjoint) <= set(spec.reads), name
        assert spec.kind in ("op", "alloc", "host_read", "view", "stream"), name
        if spec.kind == "op":
            assert spec.reads or spec.writes, f"{name} touches no array"
        # every argument that is not a scalar, flag, axis or host array is listed
        others = set(params) - set(spec.arrays) - {"self"}
        allowed = {"value", "alpha", "beta", "s", "a_min", "a_max", "axis", "val", "eps",
                          "mean", "std", "p", "transa", "transb", "arr", "shape", "k",
                          "event", "other", "array", "batches", "depth", "offset",
                   "obj", "fn", "stride", "padding", "dilation", "window",
                   "lr", "beta1", "beta2", "eps", "weight_decay", "decoupled",   # adam_update
                       "gate", "factor", "interval", "max_scale",   # loss scaling
                   "state",  # set_random_state's dict (host values)
                   "into",   # prefetch's destinations: each counts as written when yielded
                   "dtype",  # twin's format
                   "act",    # dot_bias_act's and conv2d_bias_act's activation
                   "causal", "scale",   # attention's mask and scale
                   "axes"}   # permute_t's order
        if name == "get_numpy_copy_async":
            others -= {"out"}    # host memory
        assert others <= allowed, (name, others)


def test_every_op_is_wrapped_with_the_contract_signature():
    for name in public_ops():
        method = getattr(DebugHandler, name)
        assert method is not getattr(Handler, name)
        assert (inspect.signature(method).parameters.keys()
                == inspect.signature(getattr(Handler, name)).parameters.keys()), name
        assert method.__doc__, f"DebugHandler.{name} has no docstring"


# ============================================================================ same results
class A:
    """An array argument of a recipe: shape and kind of random contents."""

    def __init__(self, shape, kind="rand"):
        self.shape, self.kind = shape, kind

    def data(self, rng):
        if self.kind == "pos":
            return rand(self.shape, rng, 0.1, 2.0)
        if self.kind == "idx":
            return rng.integers(0, C, self.shape).astype(float)
        if self.kind == "cond":
            return (rng.random(self.shape) < 0.5).astype(float)
        return rand(self.shape, rng)


class Host(A):
    """A NumPy host array argument."""


def _same(n):
    return [A(S) for _ in range(n)]


X4, W4, Y4, POOLED = (2, 3, 5, 6), (4, 3, 3, 2), (2, 4, 3, 5), (2, 3, 2, 3)
POSITIVE = {"sqrt_t", "log_t", "rsqrt_t", "pow_st"}   # ops whose inputs must be > 0 here
SCALARS = {"a_min": -0.3, "a_max": 0.4}


def _elementwise(row):
    """The recipe of an elementwise row of the op table."""
    kind = "pos" if row.name in POSITIVE else "rand"
    return [SCALARS.get(p, 0.75) if p in row.scalars
            else A(S, "cond" if p == "cond" else kind) for p in row.params]


RECIPES = {
    "get_numpy_copy": [A(S)],
    "set_from_numpy": [A(S), Host(S)],
    "copy_to": _same(2),
    "fill": [A(S), 0.25],
    "cast_t": [A(S), A(S)],
    "dot_mm": [A((4, R)), A((C, 4)), A(S)],
    "dot_add_mm": [A((R, 4)), A((4, C)), A(S)],
    "dot_bias_act": [A((R, 4)), A((4, C)), A((1, C)), A(S)],
    "axpby": [0.5, A(S), -1.5, A(S)],
    # step and v must be >= 0 (t = step + 1 >= 1, sqrt(v)): "pos" contents
    "adam_update": [A(S), 0.01, 0.9, 0.999, 1e-8, 0.1, A((1,), "pos"), A(S), A(S, "pos"),
                    A(S)],
    "scale_finite_t": [A(S), 0.5, A((1,))],
    "update_loss_scale": [A((1,)), A((4,), "pos"), 2.0, 1024.0],
    "sum_t": [A(S), 0, A((C,))],
    **{op: [A(S), 0, A((C,))] for op in ("mean_t", "max_t", "min_t", "argmax_t")},
    "transpose_m": [A(S), A((C, R))],
    "permute_t": [A(S), (1, 0), A((C, R))],
    "concat_t": [A((R, 2)), A((R, C - 2)), 1, A(S)],
    "split_t": [A(S), 0, A((1, C)), A((R - 1, C))],
    **{name: _elementwise(op) for name, op in ELEMENTWISE.items()},
    "softmax_m": _same(2),
    "broadcast_t": [A((1, C)), 0, A(S)],
    **{op: [A(S), A((R, 1)), A(S)] for op in ("add_mv", "subtract_mv", "mult_mv",
                                               "divide_mv")},
    "index_m_by_v": [A(S), A((R, 1), "idx"), A((R, 1))],
    "binarize_v": [A((R, 1), "idx"), A(S)],
    "gather_rows_m": [A((C, 3)), A((R, 1), "idx"), A((R, 3))],
    "scatter_add_rows_m": [A((R, 3)), A((R,), "idx"), A((C, 3))],
    "normalize_rows_m": [A(S), 1e-3, A(S), A((R, 1))],
    "normalize_rows_backward_m": [A(S), A((R, 1), "pos"), A(S), A(S)],
    "is_fully_finite": [A(S)],
    "fill_gaussian": [0.1, 2.0, A(S)],
    "generate_probability_mask": [A(S), 0.3],
    # NCHW: x (2, 3, 5, 6), w (4, 3, 3, 2), conv output (2, 4, 3, 5), 2x2 pools (2, 3, 2, 3)
    "attention_forward": [A((2, 2, 3, 4)), A((2, 2, 5, 4)), A((2, 2, 5, 4)), A((2, 2, 3, 4)),
                          A((2, 2, 3))],
    "attention_backward": [A((2, 2, 3, 4)), A((2, 2, 5, 4)), A((2, 2, 5, 4)), A((2, 2, 3, 4)),
                           A((2, 2, 3)), A((2, 2, 3, 4)), A((2, 2, 3, 4)), A((2, 2, 5, 4)),
                           A((2, 2, 5, 4))],
    "conv2d_forward": [A(X4), A(W4), A(Y4)],
    "conv2d_bias_act": [A(X4), A(W4), A((W4[0],)), A(Y4)],
    "conv2d_backward_data": [A(Y4), A(W4), A(X4)],
    "conv2d_backward_filter": [A(X4), A(Y4), A(W4)],
    "maxpool2d_forward": [A(X4), A(POOLED), A(POOLED), 2],
    "maxpool2d_backward": [A(POOLED, "idx"), A(POOLED), A(X4), 2],
    "avgpool2d_forward": [A(X4), A(POOLED), 2],
    "avgpool2d_backward": [A(POOLED), A(X4), 2],
}
RECIPE_KWARGS = {"dot_mm": {"transa": True, "transb": True}, "dot_bias_act": {"act": "relu"},
                 "conv2d_bias_act": {"act": "relu"}}
RANDOM_OPS = {"fill_gaussian", "generate_probability_mask"}


def test_every_op_has_a_recipe():
    # prefetch, pin and get_numpy_copy_async: tested in test_prefetch.py and below
    pipeline = {"prefetch", "pin", "get_numpy_copy_async", "empty_pinned"}
    assert set(RECIPES) | STREAM_OPS | ALLOC_OPS | VIEW_OPS | pipeline == public_ops()


def run_recipe(h, op, data):
    """Run ``op`` on ``h`` with the recipe's arguments built from ``data``;
    return its result and host copies of every array argument afterwards."""
    args, arrays = [], []
    for spec, d in zip(RECIPES[op], data):
        if isinstance(spec, Host):
            args.append(d.copy())
        elif isinstance(spec, A):
            arrays.append(h.create_from_numpy(d))
            args.append(arrays[-1])
        else:
            args.append(spec)
    result = getattr(h, op)(*args, **RECIPE_KWARGS.get(op, {}))
    return result, [h.get_numpy_copy(a) for a in arrays]


@pytest.mark.parametrize("on", ["group0", "last-group"])
@pytest.mark.parametrize("op", sorted(RECIPES))
def test_op_gives_the_plain_result(handler, handler_id, make_handler, rng, op, on):
    data = [spec.data(rng) if isinstance(spec, A) else None for spec in RECIPES[op]]
    if op in RANDOM_OPS:   # the same seed on two fresh handlers: the same numbers
        plain, wrapped = make_handler(handler_id, seed=11), make_handler(handler_id, seed=11)
    else:
        plain = wrapped = handler
    debug = DebugHandler(wrapped)
    if on == "last-group":
        plain = plain.with_streams(plain.num_stream_groups - 1)
        debug = debug.with_streams(debug.num_stream_groups - 1)
    want, want_arrays = run_recipe(plain, op, data)
    got, got_arrays = run_recipe(debug, op, data)
    if isinstance(want, np.ndarray):
        np.testing.assert_array_equal(got, want)
    else:
        assert got == want and type(got) is type(want)
    for i, (g, w) in enumerate(zip(got_arrays, want_arrays)):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w, err_msg=f"{op}: array argument {i}")


@pytest.mark.parametrize("op", sorted(ALLOC_OPS))
def test_allocators(handler, rng, op):
    debug = DebugHandler(handler).with_streams(handler.num_stream_groups - 1)
    data = rand(S, rng)
    arg = data if op == "create_from_numpy" else S
    if op == "create_from_device_array":
        arg = handler.create_from_numpy(data)   # a handler array is a device array
    got = getattr(debug, op)(arg)
    want = getattr(handler, op)(arg)
    assert isinstance(got, handler.array_type) and got.dtype == handler.dtype
    assert tuple(got.shape) == S
    if op != "allocate":
        np.testing.assert_array_equal(handler.get_numpy_copy(got), handler.get_numpy_copy(want))


def test_stream_ops(handler):
    need_groups(handler, 2)
    debug = DebugHandler(handler)
    one = debug.with_streams(1)
    ev = one.record_event()
    assert isinstance(ev, DebugEvent) and ev.group == 1
    assert ev.query() is True or ev.query() is False
    assert ev.synchronize() is None
    assert debug.wait_event(ev) is None
    assert debug.wait_for(one) is None
    assert one.wait_for(one) is None
    assert debug.wait_for(handler.with_streams(1)) is None   # a view of the inner handler
    assert one.synchronize() is None
    assert debug.synchronize_all_streams() is None


def test_views_compute_what_the_handler_computes(handler, rng):
    host = {"a": rand((64, 130), rng), "b": rand((130, 48), rng), "v": rand((1, 48), rng),
            "idx": rng.integers(0, 48, (64, 1)).astype(float)}
    expected = workload(handler, host)
    debug = DebugHandler(handler, check_finite=True)
    for k in range(handler.num_stream_groups):
        for got, want in zip(workload(debug.with_streams(k), host), expected):
            np.testing.assert_array_equal(got, want, err_msg=f"stream group {k}")


# ============================================================================ the wrapper
def test_view_attributes_and_caching(handler):
    debug = DebugHandler(handler, check_finite=True)
    assert debug.with_streams(0) is debug
    for k in range(handler.num_stream_groups):
        view = debug.with_streams(k)
        assert isinstance(view, DebugHandler)
        assert view.group == k and view.inner is handler.with_streams(k)
        assert view.dtype == handler.dtype and view.array_type is handler.array_type
        assert view.num_stream_groups == handler.num_stream_groups
        assert view.num_stream_groups == handler.num_stream_groups   # passed through
        assert view.check_finite is True
        assert debug.with_streams(k) is view and view.with_streams(k) is view
        assert view.with_streams(0) is debug
        with debug.with_streams(k) as inside:
            assert inside is view
    assert "DebugHandler" in repr(debug)


def test_wrapping_a_view(handler):
    need_groups(handler, 2)
    debug = DebugHandler(handler.with_streams(1))
    assert debug.group == 1 and debug.with_streams(1) is debug
    assert debug.with_streams(0).inner is handler


@pytest.mark.parametrize("bad", [-1, "num_stream_groups", 1.0, True, None])
def test_bad_stream_group(handler, bad):
    debug = DebugHandler(handler)
    bad = handler.num_stream_groups if bad == "num_stream_groups" else bad
    with pytest.raises(ValueError, match="with_streams"):
        debug.with_streams(bad)


def test_bad_inner():
    with pytest.raises(TypeError, match="Handler"):
        DebugHandler(object())
    with pytest.raises(TypeError, match="already"):
        DebugHandler(DebugHandler(handlers.NumpyHandler()))


class WithExtras(handlers.NumpyHandler):
    """A handler with a method outside the contract."""

    label = "extra"

    def shuffle(self, batches):
        """A backend-specific extra, not part of the contract."""
        return iter(batches)


def test_only_contract_methods_are_passed_through():
    debug = DebugHandler(WithExtras())
    assert debug.label == "extra" and debug.seed is None   # data attributes pass
    with pytest.raises(AttributeError, match="does not wrap 'shuffle'"):
        debug.shuffle([])
    with pytest.raises(AttributeError):
        debug._scratch   # noqa: B018 - private: never passed through
    assert debug.inner.shuffle([1]) is not None   # explicit bypass


def test_wait_for_needs_a_view_of_the_same_handler(handler_id, make_handler, handler):
    stranger = make_handler(handler_id, seed=0)
    debug = DebugHandler(handler)
    for other in (stranger, DebugHandler(stranger), object()):
        with pytest.raises(ValueError, match="wait_for"):
            debug.wait_for(other)


def test_wait_event_needs_an_event(handler):
    with pytest.raises(TypeError, match="wait_event"):
        DebugHandler(handler).wait_event(object())


@pytest.mark.parametrize("op_name,exc,change", CASES)
def test_bad_input_raises_like_the_handler(handler, handler_id, sibling_handler, make_handler,
                                           rng, op_name, exc, change):
    """Every bad-input case of test_validation.py, through a DebugHandler: the
    same exception type, a message naming the op, no array touched."""
    debug = DebugHandler(handler)
    call = Call(debug, handler_id, sibling_handler, make_handler, rng,
                OPS_BY_NAME[op_name], change)
    with pytest.raises(exc) as info:
        getattr(debug, method(op_name))(*call.args.values())
    assert info.type is exc, f"raised {info.type.__name__}, expected exactly {exc.__name__}"
    assert method(op_name) in str(info.value)
    call.check_unchanged()


@pytest.mark.parametrize("case", ["dtype", "noncontig", "shape", "list"])
def test_bad_input_same_message_as_the_handler(handler, sibling_handler, handler_id, case):
    debug = DebugHandler(handler)
    a, out = handler.zeros((4, 6)), handler.zeros((4, 6))
    if case == "dtype":
        other = np.float64 if handler.dtype == np.float32 else np.float32
        a = sibling_handler(handler_id, other).zeros((4, 6))
    elif case == "noncontig":
        a = handler.zeros((4, 12))[:, ::2]   # every handler's arrays slice with a step
    elif case == "shape":
        a = handler.zeros((4, 5))
    else:
        a = [[0.0] * 6] * 4
    errors = []
    for h in (handler, debug):
        with pytest.raises((TypeError, ValueError)) as info:
            h.add_tt(a, a, out)
        errors.append((info.type, str(info.value)))
    assert errors[0] == errors[1]


# ============================================================================ hazards
def _write(view, a, scratch):
    view.fill(a, 2.0)


def _read(view, a, scratch):
    view.copy_to(a, scratch)


HAZARD_PROGRAMS = {   # kind -> (first access on group 1, second access on group 2)
    "read-after-write": (_write, _read),
    "write-after-read": (_read, _write),
    "write-after-write": (_write, _write),
}
ORDERINGS = ["record_event/wait_event", "wait_for", "synchronize", "synchronize_all_streams",
             "event.synchronize"]


def order(debug, first, second, how):
    """Order group ``second`` after the work issued so far on group ``first``."""
    f, s = debug.with_streams(first), debug.with_streams(second)
    if how == "record_event/wait_event":
        s.wait_event(f.record_event())
    elif how == "wait_for":
        s.wait_for(f)
    elif how == "synchronize":
        f.synchronize()
    elif how == "synchronize_all_streams":
        s.synchronize_all_streams()
    elif how == "event.synchronize":
        f.record_event().synchronize()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("kind", HAZARD_KINDS)
def test_missing_ordering_raises(handler, kind):
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    a, s1, s2 = debug.zeros((4, 5)), debug.zeros((4, 5)), debug.ones((4, 5))
    first, second = HAZARD_PROGRAMS[kind]
    first(debug.with_streams(1), a, s1)
    before = handler.get_numpy_copy(a), handler.get_numpy_copy(s2)
    with pytest.raises(StreamHazardError) as info:
        second(debug.with_streams(2), a, s2)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert (err.kind, err.group, err.other_group, err.shape) == (kind, 2, 1, (4, 5))
    op = "copy_to" if second is _read else "fill"
    other_op = "copy_to" if first is _read else "fill"
    assert (err.op, err.other_op) == (op, other_op)
    msg = str(err)
    for part in (op, kind, "group 1", "group 2", "(4, 5)"):
        assert part in msg, f"{part!r} not in {msg!r}"
    # the op that raised did not run
    np.testing.assert_array_equal(handler.get_numpy_copy(a), before[0])
    np.testing.assert_array_equal(handler.get_numpy_copy(s2), before[1])
    # ... and left no trace: with the wait added, it goes through
    order(debug, 1, 2, "wait_for")
    second(debug.with_streams(2), a, s2)


@pytest.mark.parametrize("how", ORDERINGS)
@pytest.mark.parametrize("kind", HAZARD_KINDS)
def test_ordering_prevents_the_hazard(handler, kind, how):
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    a, s1, s2 = debug.zeros((4, 5)), debug.zeros((4, 5)), debug.zeros((4, 5))
    first, second = HAZARD_PROGRAMS[kind]
    first(debug.with_streams(1), a, s1)
    order(debug, 1, 2, how)
    second(debug.with_streams(2), a, s2)
    np.testing.assert_array_equal(debug.get_numpy_copy(a), np.full((4, 5), 2.0))


@pytest.mark.parametrize("wrong", ["reversed wait_for", "synchronize the reader",
                                   "event recorded too early", "event of the wrong group"])
def test_the_wrong_ordering_does_not_count(handler, wrong):
    debug, one, two = groups_one_two(handler)
    a, out = debug.zeros((3, 3)), debug.zeros((3, 3))
    early = one.record_event()
    one.fill(a, 1.0)
    if wrong == "reversed wait_for":
        one.wait_for(two)
    elif wrong == "synchronize the reader":
        two.synchronize()
    elif wrong == "event recorded too early":
        two.wait_event(early)
    else:
        two.wait_event(debug.record_event())
    with pytest.raises(StreamHazardError, match="read-after-write"):
        two.copy_to(a, out)


def test_ordering_is_transitive(handler):
    need_groups(handler, 4)
    debug = DebugHandler(handler)
    g = [debug.with_streams(k) for k in range(4)]
    a, out = debug.zeros((8,)), debug.zeros((8,))
    g[1].fill(a, 3.0)
    g[2].wait_for(g[1])
    g[3].wait_event(g[2].record_event())
    g[3].copy_to(a, out)   # 3 waited for 2, which waited for 1
    np.testing.assert_array_equal(debug.get_numpy_copy(out), np.full(8, 3.0))


def test_no_hazard_within_a_group_or_between_reads(handler):
    debug, one, two = groups_one_two(handler)
    a, b, c = debug.zeros((6,)), debug.zeros((6,)), debug.zeros((6,))
    one.fill(a, 1.0)
    one.add_tt(a, a, a)          # same group: issue order is enough
    one.copy_to(a, b)
    two.wait_for(one)
    one.copy_to(a, b)            # two groups reading a: no conflict
    two.copy_to(a, c)
    np.testing.assert_array_equal(debug.get_numpy_copy(c), np.full(6, 2.0))


def test_new_arrays_are_ready_on_every_group(handler, rng):
    _, one, two = groups_one_two(handler)
    made = [one.zeros((5,)), one.ones((5,)), one.create_from_numpy(rand((5,), rng)),
            one.allocate((5,))]
    for a in made:
        two.fill(a, 4.0)      # no wait needed, although group 1 created them
    out = one.allocate((5,))
    two.copy_to(made[0], out)
    for a in made + [out]:
        np.testing.assert_array_equal(handler.get_numpy_copy(a), np.full(5, 4.0))


def test_get_numpy_copy_is_an_ordering_point_for_its_buffer(handler):
    debug, one, two = groups_one_two(handler)
    a, b, out = debug.zeros((5,)), debug.zeros((5,)), debug.zeros((5,))
    one.fill(a, 5.0)
    one.fill(b, 6.0)
    np.testing.assert_array_equal(two.get_numpy_copy(a), np.full(5, 5.0))  # no hazard
    two.copy_to(a, out)          # the write of a is complete: fine
    with pytest.raises(StreamHazardError, match="read-after-write"):
        two.copy_to(b, out)      # but it says nothing about b
    # It completes writes only: a read still pending on group 1 is not covered
    # by the contract, so a write on group 2 after it is still a hazard.
    one.copy_to(a, debug.allocate((5,)))
    debug.get_numpy_copy(a)
    with pytest.raises(StreamHazardError, match="write-after-read"):
        two.fill(a, 0.0)


def test_is_fully_finite_reads_on_its_group(handler):
    # base.py only says it blocks the host; PyCudaHandler runs it on the
    # group's stream without waiting for other groups, so it needs the wait.
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    a = debug.zeros((5,))
    debug.with_streams(1).fill(a, 1.0)
    with pytest.raises(StreamHazardError, match="is_fully_finite.*read-after-write"):
        debug.with_streams(2).is_fully_finite(a)
    debug.with_streams(2).wait_for(debug.with_streams(1))
    assert debug.with_streams(2).is_fully_finite(a) is True


def test_bare_events_and_plain_views_of_the_inner_handler(handler):
    debug, one, two = groups_one_two(handler)
    a, out = debug.zeros((5,)), debug.zeros((5,))
    one.fill(a, 1.0)
    two.wait_event(handler.with_streams(1).record_event())   # unknown to the tracker
    with pytest.raises(StreamHazardError):
        two.copy_to(a, out)
    two.wait_for(handler.with_streams(1))                    # a plain view: understood
    two.copy_to(a, out)


def test_missing_wait_is_reported(handler, rng):
    """The program of DESIGN.md's stream example with the consumer's wait left out."""
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    producer, consumer = debug.with_streams(1), debug.with_streams(2)
    a = debug.create_from_numpy(rand((30, 30), rng))
    x, y, z = debug.allocate((30, 30)), debug.allocate((30, 30)), debug.allocate((30, 30))
    producer.dot_mm(a, a, x)
    producer.set_from_numpy(y, np.ones((30, 30)))
    producer.add_st(1.0, y, y)
    with pytest.raises(StreamHazardError, match="mult_tt on stream group 2: read-after-write"):
        consumer.mult_tt(x, y, z)
    consumer.wait_for(producer)
    consumer.mult_tt(x, y, z)
    ra = handler.get_numpy_copy(a).astype(np.float64)
    assert_close(debug, z, 2.0 * (ra @ ra), n=30)


# ---------------------------------------------------------------- overlapping views
def test_overlapping_views_of_one_flat_buffer(handler):
    debug, one, two = groups_one_two(handler)
    flat = debug.zeros((30,))
    out = debug.zeros((15,))
    head, mid, tail = (view_of(handler, flat, lo, hi) for lo, hi in ((0, 10), (5, 20), (10, 20)))
    one.fill(head, 1.0)                         # [0, 10) on group 1
    with pytest.raises(StreamHazardError, match="write-after-write"):
        two.fill(mid, 2.0)                      # [5, 20) overlaps it
    with pytest.raises(StreamHazardError, match="read-after-write"):
        two.copy_to(mid, out)
    two.fill(tail, 3.0)                         # [10, 20): disjoint, fine
    grid = handler.reshape_t(flat, (5, 6))
    with pytest.raises(StreamHazardError, match="read-after-write"):
        two.abs_t(grid, debug.zeros((5, 6)))    # the whole buffer, reshaped
    two.wait_for(one)
    two.copy_to(mid, out)
    expected = np.r_[np.full(5, 1.0), np.full(10, 3.0)]
    np.testing.assert_array_equal(debug.get_numpy_copy(out), expected)


def test_views_split_state_exactly(handler):
    debug, one, two = groups_one_two(handler)
    flat = debug.zeros((40,))
    def part(lo, hi):
        return view_of(handler, flat, lo, hi)
    one.copy_to(part(0, 20), debug.zeros((20,)))     # group 1 reads [0, 20)
    two.fill(part(20, 40), 1.0)                      # disjoint: fine
    with pytest.raises(StreamHazardError, match="write-after-read"):
        two.fill(part(15, 25), 1.0)                  # touches [15, 20)
    with pytest.raises(StreamHazardError, match="write-after-read"):
        two.fill(flat, 0.0)
    two.wait_for(one)
    two.fill(flat, 0.0)
    with pytest.raises(StreamHazardError, match=r"write-after-write.*\(as shape \(40,\)\)"):
        one.fill(part(0, 10), 1.0)                   # group 2 wrote all of flat
    one.wait_event(two.record_event())
    one.fill(part(0, 10), 1.0)
    two.wait_for(one)
    two.fill(part(10, 40), 2.0)
    expected = np.r_[np.full(10, 1.0), np.full(30, 2.0)]
    np.testing.assert_array_equal(debug.get_numpy_copy(flat), expected)


def test_get_numpy_copy_of_a_view_settles_only_that_view(handler):
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    flat = debug.zeros((20,))
    head, tail = (view_of(handler, flat, lo, lo + 10) for lo in (0, 10))
    debug.with_streams(1).fill(flat, 1.0)
    debug.get_numpy_copy(head)
    two = debug.with_streams(2)
    two.copy_to(head, debug.zeros((10,)))       # settled
    with pytest.raises(StreamHazardError, match="read-after-write"):
        two.copy_to(tail, debug.zeros((10,)))   # not settled


class SamePoolHandler(handlers.NumpyHandler):
    """Allocates every array on the same bytes, as a pool hands memory back."""

    def _allocate(self, shape):
        if not hasattr(self, "pool"):
            self.pool = bytearray(1 << 12)
        n = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.pool, self.dtype, n).reshape(shape)


def test_allocation_resets_reused_memory():
    debug = DebugHandler(SamePoolHandler())
    old = debug.allocate((8,))
    debug.with_streams(1).fill(old, 1.0)
    new = debug.allocate((4,))     # the same bytes; old is still referenced
    assert byte_range(new)[0] == byte_range(old)[0]
    debug.with_streams(2).fill(new, 2.0)
    with pytest.raises(StreamHazardError):   # old's other half kept its state
        debug.with_streams(2).fill(old, 2.0)


def test_freed_memory_starts_fresh(handler):
    if handler.array_type is not np.ndarray:
        pytest.skip("needs NumPy arrays over a reusable host buffer")
    need_groups(handler, 3)
    debug = DebugHandler(handler)
    buf = bytearray(8 * 16)
    first = np.frombuffer(buf, dtype=handler.dtype)
    debug.with_streams(1).fill(first, 1.0)
    with pytest.raises(StreamHazardError):
        debug.with_streams(2).fill(np.frombuffer(buf, dtype=handler.dtype), 2.0)
    del first
    gc.collect()
    # The same bytes, a new array: the old array's state died with it.
    debug.with_streams(2).fill(np.frombuffer(buf, dtype=handler.dtype), 2.0)


def test_tracker_is_pruned_of_freed_arrays(handler):
    if handler.array_type is not np.ndarray:
        pytest.skip("needs NumPy arrays at chosen host addresses")
    debug = DebugHandler(handler)
    item = np.dtype(handler.dtype).itemsize
    buf = bytearray(item * 4 * 5000)
    for i in range(5000):   # 5000 distinct ranges, each freed after its use
        debug.with_streams(i % 2).fill(np.frombuffer(buf, handler.dtype, 3, 4 * item * i), 1.0)
    # internal: without pruning, the interval map would hold 5000 segments
    assert len(debug._shared.tracker._segs) <= 1100


def test_tracker_size_follows_live_arrays(handler):
    need_groups(handler, 2)
    debug = DebugHandler(handler)
    keep = debug.zeros((64,))
    for i in range(3000):
        view = debug.with_streams(i % 2)
        view.wait_for(debug.with_streams(1 - i % 2))
        view.fill(handler.zeros((17 + i % 50,)), 1.0)   # freed right after
        view.fill(keep, float(i))
    # internal: the interval map is pruned of freed arrays as it grows
    assert len(debug._shared.tracker._segs) <= 1100


# ============================================================================ aliasing
def test_out_may_be_an_input(handler, rng):
    debug = DebugHandler(handler)
    a0, b0 = rand(S, rng), rand(S, rng)
    a, b = debug.create_from_numpy(a0), debug.create_from_numpy(b0)
    a0, b0 = a0.astype(handler.dtype).astype(float), b0.astype(handler.dtype).astype(float)
    debug.add_tt(a, b, a)
    debug.add_tt(a, b, b)
    debug.tanh(a, a)
    debug.axpby(2.0, a, 0.5, a)
    debug.copy_to(a, a)
    debug.tanh_deriv(a, b, a, a)
    a1 = a0 + b0
    b1 = a1 + b0
    a1 = 2.5 * np.tanh(a1)
    a1 = a1 * (1 - b1 * b1)
    np.testing.assert_allclose(debug.get_numpy_copy(a), a1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(debug.get_numpy_copy(b), b1, rtol=1e-5, atol=1e-6)
    m0 = rand(S, rng)
    m = debug.create_from_numpy(m0)
    v0 = rng.integers(0, C, (R, 1)).astype(float)
    v = debug.create_from_numpy(v0)
    debug.index_m_by_v(m, v, v)
    np.testing.assert_array_equal(debug.get_numpy_copy(v)[:, 0],
                                  m0.astype(handler.dtype)[np.arange(R), v0[:, 0].astype(int)])
    row0 = rand((1, C), rng)
    row = debug.create_from_numpy(row0)
    debug.broadcast_t(row, 0, row)   # out.shape[axis] == 1: a copy onto itself
    np.testing.assert_array_equal(debug.get_numpy_copy(row), row0.astype(handler.dtype))
    twice = debug.zeros(S)
    debug.add_tt(m, m, twice)   # two inputs may share memory
    np.testing.assert_allclose(debug.get_numpy_copy(twice), 2 * m0, rtol=1e-6)


def _flat_views(handler, n, *spans):
    flat = handler.create_from_numpy(np.arange(n, dtype=float))
    return flat, [view_of(handler, flat, *span) for span in spans]


@pytest.mark.parametrize("case", ["add_tt", "tanh", "copy_to", "axpby", "add_mv-v",
                                  "sigmoid_deriv", "copy_to_if", "fill_if", "broadcast_t"])
def test_partial_overlap_raises(handler, case):
    debug = DebugHandler(handler)
    flat, (x, y) = _flat_views(handler, 30, (0, 12, (3, 4)), (2, 14, (3, 4)))
    other = debug.ones((3, 4))
    before = handler.get_numpy_copy(flat)
    calls = {
        "add_tt": lambda: debug.add_tt(x, other, y),
        "tanh": lambda: debug.tanh(x, y),
        "copy_to": lambda: debug.copy_to(x, y),
        "axpby": lambda: debug.axpby(1.0, x, 1.0, y),
        "add_mv-v": lambda: debug.add_mv(other, view_of(handler, flat, 12, 15, (3, 1)),
                                         view_of(handler, flat, 4, 16, (3, 4))),
        "sigmoid_deriv": lambda: debug.sigmoid_deriv(x, other, other, y),
        "copy_to_if": lambda: debug.copy_to_if(other, y, x),
        "fill_if": lambda: debug.fill_if(y, 1.0, x),
        "broadcast_t": lambda: debug.broadcast_t(
            view_of(handler, flat, 0, 4, (1, 4)), 0, y),
    }
    with pytest.raises(ValueError, match=case.split("-")[0]) as info:
        calls[case]()
    assert "overlap" in str(info.value)
    np.testing.assert_array_equal(handler.get_numpy_copy(flat), before)


BIAS_ADD = handlers.fused_op("bias_add_debug", inputs="x b:row", outputs="y", body="y = x + b")


@pytest.mark.parametrize("case", ["broadcast_t", "add_mv", "fused-row", "add_tt-later-start",
                                  "tanh-earlier-start", "mult_st-inside"])
def test_partial_overlap_is_judged_on_whole_ranges(handler, rng, case):
    """DebugHandler reports a partial overlap of an output and an input
    itself, whatever their starts: an input starting where the output starts
    but shorter (so equal starts do not make the same memory), and arrays
    with different starts that overlap; nothing is written."""
    debug = DebugHandler(handler)
    flat = handler.create_from_numpy(rand((40,), rng))
    before = handler.get_numpy_copy(flat)

    def part(lo, hi, shape):
        return view_of(handler, flat, lo, hi, shape)
    other = debug.ones((3, 4))
    calls = {   # case -> (call, output name, input name)
        "broadcast_t": (lambda: debug.broadcast_t(part(0, 4, (1, 4)), 0, part(0, 12, (3, 4))),
                        "out", "a"),
        "add_mv": (lambda: debug.add_mv(other, part(4, 7, (3, 1)), part(4, 16, (3, 4))),
                   "out", "v"),
        "fused-row": (lambda: BIAS_ADD(debug, other, part(8, 12, (4,)), part(8, 20, (3, 4))),
                      "y", "b"),
        "add_tt-later-start": (lambda: debug.add_tt(part(0, 12, (3, 4)), other,
                                                    part(2, 14, (3, 4))), "out", "a"),
        "tanh-earlier-start": (lambda: debug.tanh(part(5, 17, (3, 4)), part(1, 13, (3, 4))),
                               "y", "x"),
        "mult_st-inside": (lambda: debug.mult_st(2.0, part(0, 12, (12,)), part(4, 16, (12,))),
                           "out", "t"),
    }
    call, out, src = calls[case]
    with pytest.raises(ValueError, match=rf"{out} \(shape \([0-9, ]+\)\) partially overlaps "
                                         rf"{src} \(shape"):
        call()
    np.testing.assert_array_equal(handler.get_numpy_copy(flat), before)


@pytest.mark.parametrize("case", ["dot_mm", "dot_add_mm", "sum_t", "index_m_by_v-m",
                                  "index_m_by_v-out-is-m", "binarize_v"])
def test_forbidden_overlap_raises(handler, case):
    debug = DebugHandler(handler)
    a = debug.ones((4, 4))
    calls = {
        "dot_mm": lambda: debug.dot_mm(a, debug.ones((4, 4)), a),
        "dot_add_mm": lambda: debug.dot_add_mm(debug.ones((4, 4)), a, a),
        "sum_t": lambda: debug.sum_t(a, None, view_of(handler, a, 0, 1)),
        "index_m_by_v-m": lambda: debug.index_m_by_v(
            a, debug.zeros((4, 1)), view_of(handler, a, 0, 4, (4, 1))),
        # base.py does not check this one: out may be v, but never m
        "index_m_by_v-out-is-m": lambda: debug.index_m_by_v(
            view_of(handler, a, 0, 4, (4, 1)), debug.zeros((4, 1)),
            view_of(handler, a, 0, 4, (4, 1))),
        "binarize_v": lambda: debug.binarize_v(
            view_of(handler, a, 0, 4, (4, 1)), a),
    }
    with pytest.raises(ValueError, match=case.split("-")[0]) as info:
        calls[case]()
    assert "overlap" in str(info.value)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), np.ones((4, 4)))


def test_byte_range():
    a = np.zeros((4, 6), np.float32)
    start = a.__array_interface__["data"][0]
    assert byte_range(a) == (start, start + 96)
    assert byte_range(a[1:3]) == (start + 24, start + 72)
    assert byte_range(a[:, ::2]) == (start, start + 96 - 4)
    assert byte_range(a[::-1]) == (start, start + 96)
    assert byte_range(a[:0])[0] == byte_range(a[:0])[1]

    class CudaLike:   # CuPy, PyTorch: only __cuda_array_interface__
        shape, dtype, strides = (10,), np.dtype(np.float64), None

        @property
        def __cuda_array_interface__(self):
            return {"data": (4096, False), "shape": (10,), "typestr": "<f8", "version": 3}

    class GpuArrayLike:   # pycuda GPUArray: gpudata
        shape, dtype, strides, gpudata = (3, 2), np.dtype(np.float32), (8, 4), 8192

    assert byte_range(CudaLike()) == (4096, 4176)
    assert byte_range(GpuArrayLike()) == (8192, 8216)
    with pytest.raises(TypeError):
        byte_range(object())


# ============================================================================ NaN and Inf
def _finite_case(debug, handler, case):
    z = debug.create_from_numpy(np.array([[1.0], [0.0], [2.0]]))
    out = debug.allocate((3, 1))
    if case == "log_t":
        debug.log_t(z, out)
    elif case == "divide_tt":
        debug.divide_tt(debug.ones((3, 1)), z, out)
    elif case == "index_m_by_v":
        m = debug.ones((3, 4))
        debug.index_m_by_v(m, debug.create_from_numpy(np.array([[0.0], [7.0], [1.0]])), out)
    elif case == "exp_t":
        debug.exp_t(debug.create_from_numpy(np.full((3, 1), 1e4)), out)
    elif case == "sqrt_t":
        debug.sqrt_t(debug.create_from_numpy(np.full((3, 1), -1.0)), out)
    return out


@pytest.mark.parametrize("case", ["log_t", "divide_tt", "index_m_by_v", "exp_t", "sqrt_t"])
def test_check_finite_names_the_producing_op(handler, case):
    debug = DebugHandler(handler, check_finite=True)
    with pytest.raises(FloatingPointError, match=rf"{case} on stream group 0 produced") as info:
        _finite_case(debug, handler, case)
    assert "input" not in str(info.value)
    _finite_case(DebugHandler(handler), handler, case)   # no flag, no check


def test_check_finite_on_a_view_names_its_group(handler):
    need_groups(handler, 2)
    debug = DebugHandler(handler, check_finite=True).with_streams(1)
    with pytest.raises(FloatingPointError, match="log_t on stream group 1 produced"):
        debug.log_t(debug.zeros((3,)), debug.allocate((3,)))


def test_check_finite_input_from_outside(handler):
    debug = DebugHandler(handler, check_finite=True)
    bad = handler.create_from_numpy(np.array([1.0, np.nan, 2.0]))   # not through debug
    with pytest.raises(FloatingPointError, match=r"input to op add_tt: b \(shape \(3,\)\)"):
        debug.add_tt(debug.ones((3,)), bad, debug.allocate((3,)))
    with pytest.raises(FloatingPointError, match="create_from_numpy on stream group 0 produced"):
        debug.create_from_numpy(np.array([np.inf]))
    with pytest.raises(FloatingPointError, match="set_from_numpy on stream group 0 produced"):
        debug.set_from_numpy(debug.zeros((2,)), np.array([0.0, np.nan]))


def test_check_finite_lets_what_is_not_read_through(handler):
    debug = DebugHandler(handler, check_finite=True)
    nan = handler.create_from_numpy(np.full(4, np.nan))
    assert debug.is_fully_finite(nan) is False                       # a query, not a check
    assert np.isnan(debug.get_numpy_copy(nan)).all()
    debug.axpby(2.0, debug.ones((4,)), 0.0, nan)                      # beta = 0 ignores y
    np.testing.assert_array_equal(debug.get_numpy_copy(nan), np.full(4, 2.0))
    garbage = handler.create_from_numpy(np.full((2, 2), np.inf))     # only written
    debug.dot_mm(debug.ones((2, 3)), debug.ones((3, 2)), garbage)
    x = handler.create_from_numpy(np.full(3, np.nan))                 # unused by sigmoid_deriv
    y = debug.zeros((3,))
    debug.sigmoid_deriv(x, y, debug.ones((3,)), debug.allocate((3,)))
    with pytest.raises(FloatingPointError, match="input to op axpby"):
        debug.axpby(2.0, debug.ones((4,)), 0.5, handler.create_from_numpy(np.full(4, np.nan)))


# ============================================================================ a random schedule
def test_random_correct_schedule_has_no_hazard_and_same_results(handler, rng):
    """Random elementwise ops on random groups, each preceded by the waits it
    needs (by a simple oracle over whole buffers): never a hazard, and the same
    result as the plain handler on one group."""
    groups = handler.num_stream_groups
    debug = DebugHandler(handler)
    n_buf = 6
    data = [rand((50,), rng) for _ in range(n_buf)]
    bufs = [debug.create_from_numpy(d) for d in data]
    ref = [handler.create_from_numpy(d) for d in data]
    writer, readers = [None] * n_buf, [set() for _ in range(n_buf)]
    for _ in range(300):
        g = int(rng.integers(groups))
        i, j, k = (int(x) for x in rng.choice(n_buf, 3, replace=False))
        op = ["add_tt", "mult_tt", "subtract_tt"][int(rng.integers(3))]
        need = ({writer[i], writer[j], writer[k]} | readers[k]) - {None, g}
        view = debug.with_streams(g)
        for other in need:
            how = ORDERINGS[int(rng.integers(len(ORDERINGS)))]
            order(debug, other, g, how)
        getattr(view, op)(bufs[i], bufs[j], bufs[k])
        getattr(handler, op)(ref[i], ref[j], ref[k])
        debug.with_streams(g).tanh(bufs[k], bufs[k])
        handler.tanh(ref[k], ref[k])
        readers[i].add(g)
        readers[j].add(g)
        writer[k], readers[k] = g, set()
    for b, r in zip(bufs, ref):
        np.testing.assert_array_equal(debug.get_numpy_copy(b), handler.get_numpy_copy(r))


def test_prefetched_batch_read_on_another_group_is_a_hazard(handler):
    from handlers import DebugHandler, StreamHazardError
    dh = DebugHandler(handler)
    data = [np.ones((4, 3)) for _ in range(3)]
    out = dh.zeros((4, 3))
    for xb in dh.prefetch(data):
        dh.add_tt(xb, xb, out)             # same group: fine
    batches = dh.prefetch(data)
    xb = next(batches)
    with pytest.raises(StreamHazardError):
        dh.with_streams(1).add_tt(xb, xb, dh.with_streams(1).zeros((4, 3)))
    dh.with_streams(1).wait_for(dh)
    dh.with_streams(1).add_tt(xb, xb, dh.with_streams(1).zeros((4, 3)))
    batches.close()


def test_a_view_shares_the_hazard_state_of_its_array(handler):
    # A write through a view, then a read of the array on another group
    # without a wait: the same memory, so the same hazard as without the view.
    if handler.num_stream_groups < 2:
        pytest.skip("needs two stream groups")
    debug = DebugHandler(handler)
    a = debug.zeros((4, 6))
    flat = debug.reshape_t(a, (24,))
    part = debug.view_t(a, 6, (2, 3))
    debug.fill(part, 1.0)
    with pytest.raises(StreamHazardError, match="read-after-write"):
        debug.with_streams(1).sum_t(flat, 0, debug.zeros((1,)))
