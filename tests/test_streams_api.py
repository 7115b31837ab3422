"""The stream-group API: views from ``with_streams``, events and synchronisation.

Results on any group must equal, bit for bit, the same ops on the plain handler.
No timing is measured: NumpyHandler runs ops at once, which is a valid schedule.
"""
import numpy as np
import pytest

from handlers import NumpyHandler
from helpers import assert_close, poisoned, rand, rand_input


def groups(handler):
    return range(handler.num_stream_groups)


def need_groups(handler, n):
    if handler.num_stream_groups < n:
        pytest.skip(f"needs {n} stream groups, handler has {handler.num_stream_groups}")


def workload(h, host):
    """A handful of different ops issued on ``h`` (a handler or a view); returns
    host copies of every result."""
    a = h.create_from_numpy(host["a"])
    b = h.create_from_numpy(host["b"])
    v = h.create_from_numpy(host["v"])
    idx = h.create_from_numpy(host["idx"])
    prod = h.allocate((64, 48))
    h.dot_mm(a, b, prod)
    h.dot_add_mm(a, b, prod, transa=False, transb=False)
    act = h.zeros((64, 48))
    h.add_mv(prod, v, act)
    h.tanh(act, act)
    col = h.allocate((48,))
    h.sum_t(act, 0, col)
    h.axpby(0.5, act, -1.5, prod)
    soft = h.allocate((64, 48))
    h.softmax_m(prod, soft)
    picked = h.allocate((64, 1))
    h.index_m_by_v(soft, idx, picked)
    copy = h.ones((64, 48))
    h.copy_to(soft, copy)
    h.mult_st(3.0, copy, copy)
    return [h.get_numpy_copy(x) for x in (prod, act, col, soft, picked, copy)]


@pytest.fixture
def host_inputs(rng):
    return {"a": rand((64, 130), rng), "b": rand((130, 48), rng), "v": rand((1, 48), rng),
            "idx": rng.integers(0, 48, (64, 1)).astype(float)}


def test_views_compute_what_the_handler_computes(handler, host_inputs):
    expected = workload(handler, host_inputs)
    for k in groups(handler):
        view = handler.with_streams(k)
        for got, want in zip(workload(view, host_inputs), expected):
            np.testing.assert_array_equal(got, want, err_msg=f"stream group {k}")


def test_view_attributes_and_caching(handler):
    assert handler.with_streams(0) is handler
    for k in groups(handler):
        view = handler.with_streams(k)
        assert view.group == k
        assert view.dtype == handler.dtype
        assert view.num_stream_groups == handler.num_stream_groups
        assert view.array_type is handler.array_type
        assert handler.with_streams(k) is view, "views are cached"
        assert view.with_streams(0) is handler
        assert view.with_streams(k) is view


def test_context_manager_yields_the_view(handler):
    for k in groups(handler):
        view = handler.with_streams(k)
        with handler.with_streams(k) as inside:
            assert inside is view
            a = inside.zeros((3,))
            inside.add_st(1.5, a, a)
        assert_close(handler, a, np.full(3, 1.5))


@pytest.mark.parametrize("bad", ["num_stream_groups", -1, "num_stream_groups+5", 1.0, True,
                                 "1", None])
def test_bad_stream_group(handler, bad):
    n = handler.num_stream_groups
    bad = {"num_stream_groups": n, "num_stream_groups+5": n + 5}.get(bad, bad)
    handler.with_streams(1 % n)  # a cached view must not let 1.0 or True through
    with pytest.raises(ValueError, match="with_streams"):
        handler.with_streams(bad)
    with pytest.raises(ValueError, match="with_streams"):
        handler.with_streams(1 % n).with_streams(bad)


def _long_work(h, a, b, x, rounds):
    """x += a @ b, ``rounds`` times, on ``h``'s group: on a GPU, work still
    running when the host issues the next calls (64 products of 512x512
    matrices, about 17 GFLOP), and every partial state of x differs from the
    final one by a multiple of a @ b."""
    for _ in range(rounds):
        h.dot_add_mm(a, b, x)


@pytest.mark.parametrize("order", ["record_event/wait_event", "wait_for", "synchronize",
                                   "synchronize_all_streams"])
def test_events_and_synchronisation_order_work(handler, rng, order):
    """Each ordering point makes work on one group see work issued before it
    on another: a long run of products on the producer group, then the
    ordering point, then an op on the consumer group that reads their sum
    (into a NaN-poisoned output) must compute from the finished values, for
    every pair of neighbouring groups.  After a synchronize (or an event's
    own synchronize) the events recorded before it report ``query()`` True.
    (NumpyHandler runs ops at once, so a few products do; on a GPU a no-op
    wait or synchronize lets the consumer read a partial sum.)"""
    need_groups(handler, 2)
    n = handler.num_stream_groups
    rounds = 4 if isinstance(handler, NumpyHandler) else 64
    a, ra = rand_input(handler, (512, 512), rng)
    b, rb = rand_input(handler, (512, 512), rng)
    want = 2 * rounds * (ra @ rb)
    for k in range(n):
        producer, consumer = handler.with_streams(k), handler.with_streams((k + 1) % n)
        x, z = handler.zeros((512, 512)), poisoned(handler, (512, 512))
        _long_work(producer, a, b, x, rounds)
        if order == "record_event/wait_event":
            event = producer.record_event()
            consumer.wait_event(event)
            consumer.mult_st(2.0, x, z)
            event.synchronize()
        elif order == "wait_for":
            consumer.wait_for(producer)
            consumer.mult_st(2.0, x, z)
            event = consumer.record_event()     # after the consumer's op, so after x too
            consumer.synchronize()
        elif order == "synchronize":
            event = producer.record_event()
            producer.synchronize()              # the host waits: later work sees x
            assert event.query() is True
            consumer.mult_st(2.0, x, z)
        else:
            event = producer.record_event()
            events = [event]
            for g in range(n):                  # every group busy, then one host wait
                if g != k:
                    view = handler.with_streams(g)
                    _long_work(view, a, b, handler.zeros((512, 512)), rounds)
                    events.append(view.record_event())
            consumer.synchronize_all_streams()
            assert all(e.query() is True for e in events)
            consumer.mult_st(2.0, x, z)
        assert event.query() is True
        assert_close(handler, z, want, n=512 * rounds,
                     err_msg=f"{order}, groups {k} -> {(k + 1) % n}")


def test_wait_event_takes_only_events(handler):
    """``wait_event`` checks its argument: an event from ``record_event``
    (of any group) is waited on; anything else is a TypeError naming the
    op, so a no-op wait is not mistaken for a working one."""
    need_groups(handler, 2)
    for k in groups(handler):
        view = handler.with_streams(k)
        other = handler.with_streams((k + 1) % handler.num_stream_groups)
        event = view.record_event()
        assert other.wait_event(event) is None
        assert view.wait_event(event) is None          # the same group: allowed
        assert view.wait_for(view) is None
        for bad in (None, object(), 1.0, view):
            with pytest.raises(TypeError, match="wait_event"):
                other.wait_event(bad)


def test_get_numpy_copy_sees_work_of_other_groups(handler, rng):
    need_groups(handler, 2)
    a, ra = rand_input(handler, (256, 300), rng)
    b, rb = rand_input(handler, (300, 200), rng)
    for k in range(1, handler.num_stream_groups):
        out = handler.allocate((256, 200))
        handler.with_streams(k).dot_mm(a, b, out)
        assert_close(handler, out, ra @ rb, n=300)  # read from group 0, no explicit sync
        big = handler.zeros((1 << 20,))
        handler.with_streams(k).fill(big, float(k))
        got = handler.with_streams((k + 1) % handler.num_stream_groups).get_numpy_copy(big)
        np.testing.assert_array_equal(got, np.full(1 << 20, float(k)))


def test_new_arrays_are_ready_on_every_group(handler, rng):
    data = rand((1 << 20,), rng)
    for k in groups(handler):
        created = {"zeros": handler.zeros(data.shape), "ones": handler.ones(data.shape),
                   "create_from_numpy": handler.create_from_numpy(data)}
        out = handler.allocate(data.shape)
        view = handler.with_streams(k)
        for name, arr in created.items():
            view.copy_to(arr, out)
            expected = {"zeros": 0.0, "ones": 1.0}.get(name, data.astype(handler.dtype))
            np.testing.assert_array_equal(view.get_numpy_copy(out),
                                          np.broadcast_to(expected, data.shape),
                                          err_msg=f"{name} then use on group {k}")


@pytest.mark.parametrize("order", ["record_event/wait_event", "wait_for", "synchronize"])
def test_ordering_between_groups(handler, rng, order):
    need_groups(handler, 3)
    producer, consumer = handler.with_streams(1), handler.with_streams(2)
    a, ra = rand_input(handler, (300, 300), rng)
    x = handler.allocate((300, 300))
    y = handler.allocate((300, 300))
    producer.dot_mm(a, a, x)
    producer.set_from_numpy(y, np.ones((300, 300)))
    producer.add_st(1.0, y, y)
    if order == "record_event/wait_event":
        consumer.wait_event(producer.record_event())
    elif order == "wait_for":
        consumer.wait_for(producer)
    else:
        producer.synchronize()
    z = handler.allocate((300, 300))
    consumer.mult_tt(x, y, z)
    assert_close(handler, z, 2.0 * (ra @ ra), n=300)


def test_wait_for_needs_a_view_of_the_same_handler(handler_id, make_handler, handler):
    stranger = make_handler(handler_id, seed=0)
    with pytest.raises(ValueError, match="wait_for"):
        handler.wait_for(stranger)
    with pytest.raises(ValueError, match="wait_for"):
        handler.with_streams(1 % handler.num_stream_groups).wait_for(stranger.with_streams(0))


def test_views_share_the_handlers_state(handler):
    """A view is the handler seen from one group: one state, nothing copied,
    so state set after the view was made is seen through it."""
    if handler.num_stream_groups < 2:
        pytest.skip("needs two stream groups")
    view = handler.with_streams(1)
    assert view.__dict__ is handler.__dict__
    assert (view.group, handler.group) == (1, 0)
    marker = object()
    handler._shared_marker = marker
    try:
        assert view._shared_marker is marker
    finally:
        del handler._shared_marker
    assert isinstance(view, type(handler)) and type(view).__name__ == type(handler).__name__
    a = view.create_from_numpy(np.arange(3.0))
    view.add_st(1.0, a, a)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), [1.0, 2.0, 3.0])
