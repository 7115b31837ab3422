"""Graphs (``Handler.capture``, ``Graph.replay``), per handler.

What must hold: a replay computes what issuing the captured ops again would,
bit for bit (training steps of an MLP, an LSTM on stream groups and a dropout
model; 120 random programs over four groups); random ops draw fresh values on
each replay, the eager sequence; device scalars are read at replay; every call
that cannot be recorded raises ``CaptureError`` at capture time with nothing
written, and the handler stays usable after any failed capture.
"""
import gc

import numpy as np
import pytest

from handlers import CaptureError, DebugHandler, NumpyHandler, StreamHazardError
from handlers.graphs import WORK_HOOKS
from handlers.hooks import HOOKS
from helpers import rand
from layers import SGD, Dropout, FullyConnected, ReLU, Sequential, SoftmaxCrossEntropy, Trainer
from test_debug_handler import RANDOM_OPS, RECIPE_KWARGS, RECIPES, A, Host
from test_layers_training import lstm_net, mlp, toy_sequences
from test_streams_stress import (
    GROUPS,
    POOL,
    Init,
    Stall,
    Step,
    allocate_pool,
    differences,
    make_program,
    make_stalls,
    program_seeds,
    run_program,
)

S = (5, 7)


def need_groups(h, n):
    if h.num_stream_groups < n:
        pytest.skip(f"needs {n} stream groups, handler has {h.num_stream_groups}")


# ============================================================================ basics
def test_capture_records_without_running_and_replay_runs(handler, rng):
    a0, b0 = rand(S, rng), rand(S, rng)
    a, b, out = (handler.create_from_numpy(x) for x in (a0, b0, np.full(S, 7.0)))
    with handler.capture() as g:
        handler.add_tt(a, b, out)
        handler.mult_st(0.5, out, out)
        handler.axpby(2.0, a, 1.0, out)     # out = (a + b) / 2 + 2a, then +2a per replay
    np.testing.assert_array_equal(handler.get_numpy_copy(out), np.full(S, 7.0))
    assert g.ops == 3 and g.groups == (0,)
    want = np.full(S, 7.0, handler.dtype)
    for _ in range(3):
        g.replay()
        want = (a0.astype(handler.dtype) + b0.astype(handler.dtype)) * handler.dtype.type(0.5)
        want = want + 2 * a0.astype(handler.dtype)
        np.testing.assert_allclose(handler.get_numpy_copy(out), want,
                                   rtol=1e-6 if handler.dtype == np.float32 else 1e-12)
    g.close()
    with pytest.raises(CaptureError, match="closed"):
        g.replay()


def test_capture_of_a_function(handler, rng):
    x = handler.create_from_numpy(rand(S, rng))
    y = handler.zeros(S)
    g = handler.capture(lambda: handler.add_tt(x, y, y))
    for _ in range(4):
        g.replay()
    np.testing.assert_allclose(handler.get_numpy_copy(y), 4 * handler.get_numpy_copy(x),
                               rtol=1e-6)


@pytest.mark.parametrize("op", sorted(op for op, spec in RECIPES.items()
                                      if op not in ("get_numpy_copy", "set_from_numpy",
                                                    "is_fully_finite")))
def test_every_op_is_recorded_and_replays_as_eager(make_handler, handler_id, rng, op):
    """Each op inside a capture writes nothing until replay, and its replay
    gives the eager result bit for bit.  A random op runs eagerly on a second
    handler of the same seed; any other op on the handler that captures it,
    since some results are a handler's own: a convolution runs the engine its
    handler timed fastest at its first call, and two handlers may pick
    different ones where two engines time alike (``deterministic`` in
    PyCudaHandler's docstring)."""
    captured = make_handler(handler_id, seed=5)
    eager = make_handler(handler_id, seed=5) if op in RANDOM_OPS else captured
    data = [spec.data(rng) if isinstance(spec, A) and not isinstance(spec, Host) else None
            for spec in RECIPES[op]]

    def build(h):
        args, arrays = [], []
        for spec, d in zip(RECIPES[op], data):
            if isinstance(spec, A):
                arrays.append(h.create_from_numpy(d))
                args.append(arrays[-1])
            else:
                args.append(spec)
        return args, arrays

    args, arrays = build(eager)
    getattr(eager, op)(*args, **RECIPE_KWARGS.get(op, {}))
    want = [eager.get_numpy_copy(a) for a in arrays]

    args, arrays = build(captured)
    with captured.capture() as g:
        getattr(captured, op)(*args, **RECIPE_KWARGS.get(op, {}))
    for a, d in zip(arrays, [d for d in data if d is not None]):
        np.testing.assert_array_equal(captured.get_numpy_copy(a), d.astype(captured.dtype),
                                      err_msg=f"{op} ran inside the capture")
    g.replay()
    for i, (a, w) in enumerate(zip(arrays, want)):
        np.testing.assert_array_equal(captured.get_numpy_copy(a), w,
                                      err_msg=f"{op}: array argument {i}")


def test_work_hooks_cover_numpy_handler():
    """Every private method of NumpyHandler is a backend hook of the one
    registry (``handlers.hooks``), whose kind says whether a capture records
    it, or one of the handler's own helpers; a capture records exactly the
    work hooks."""
    helpers = {"_scratch", "_add_product", "_valid_index", "_overlaps", "_same_memory",
               "_span"}
    methods = {name for name, value in vars(NumpyHandler).items()
               if callable(value) and name.startswith("_") and not name.startswith("__")}
    assert methods - helpers <= set(HOOKS), sorted(methods - helpers - set(HOOKS))
    assert set(WORK_HOOKS) == {n for n, (kind, _, _) in HOOKS.items() if kind == "work"}
    assert set(WORK_HOOKS) <= methods | {"_elementwise"}   # written by the backend


# ============================================================================ streams
def test_forked_groups_become_branches(handler, rng):
    need_groups(handler, 3)
    h1, h2 = handler.with_streams(1), handler.with_streams(2)
    x0 = rand(S, rng)
    x = handler.create_from_numpy(x0)
    a, b, out = handler.zeros(S), handler.zeros(S), handler.zeros(S)
    with handler.capture() as g:
        h1.wait_for(handler)
        ev = handler.record_event()
        h2.wait_event(ev)
        h1.mult_st(2.0, x, a)
        h2.mult_st(3.0, x, b)
        handler.wait_for(h1)
        handler.wait_for(h2)
        handler.add_tt(a, b, out)
    assert g.groups == (0, 1, 2)
    g.replay()
    np.testing.assert_allclose(handler.get_numpy_copy(out), 5 * x0.astype(handler.dtype),
                               rtol=1e-6)


def test_unjoined_group_raises_and_handler_stays_usable(handler, rng):
    need_groups(handler, 3)
    h2 = handler.with_streams(2)
    x = handler.create_from_numpy(rand(S, rng))
    y = handler.zeros(S)
    with pytest.raises(CaptureError, match="group 2 .*relu"):
        with handler.capture():
            h2.wait_for(handler)
            h2.relu(x, y)
    np.testing.assert_array_equal(handler.get_numpy_copy(y), np.zeros(S))
    h2.relu(x, y)      # eager work on the group runs again
    handler.wait_for(h2)
    np.testing.assert_array_equal(handler.get_numpy_copy(y),
                                  np.maximum(handler.get_numpy_copy(x), 0))
    g = handler.capture(lambda: handler.fill(y, 1.5))   # and capturing works again
    g.replay()
    assert handler.get_numpy_copy(y).max() == 1.5


def test_work_on_a_group_outside_the_capture_raises(handler, rng):
    need_groups(handler, 2)
    x = handler.create_from_numpy(rand(S, rng))
    with pytest.raises(CaptureError, match="add_tt: stream group 1 is not part"):
        with handler.capture():
            handler.with_streams(1).add_tt(x, x, x)
    with pytest.raises(CaptureError, match="wait_for: stream group 1"):
        with handler.capture():
            handler.wait_for(handler.with_streams(1))
    ev = handler.record_event()
    with pytest.raises(CaptureError, match="recorded outside"):
        with handler.capture():
            handler.with_streams(1).wait_event(ev)


def test_event_of_an_earlier_capture_cannot_be_waited_on(handler, rng):
    """An event recorded inside one capture orders work within that capture
    only: waiting on it inside a later capture (on the capturing group or to
    fork another group) raises ``CaptureError``, and records nothing."""
    x = handler.create_from_numpy(rand(S, rng))
    y = handler.zeros(S)
    with handler.capture() as first:
        handler.mult_st(2.0, x, y)
        stale = handler.record_event()
    groups = [handler] + ([handler.with_streams(1)] if handler.num_stream_groups > 1 else [])
    for view in groups:
        with pytest.raises(CaptureError, match="wait_event: the event was recorded outside "
                                               "this capture"):
            with handler.capture():
                handler.fill(y, 3.0)
                view.wait_event(stale)
                view.add_tt(x, x, y)
                handler.wait_for(view)
    np.testing.assert_array_equal(handler.get_numpy_copy(y), np.zeros(S))
    first.replay()                      # the first graph is untouched
    np.testing.assert_allclose(handler.get_numpy_copy(y),
                               2 * handler.get_numpy_copy(x).astype(np.float64), rtol=1e-6)


def test_view_first_made_inside_a_capture_is_recorded(make_handler, handler_id, rng):
    """A stream-group view made for the first time inside a capture records
    its ops like any view: nothing runs until replay, and the replay computes
    them (each replay once more)."""
    h = make_handler(handler_id)
    need_groups(h, 2)
    assert 1 not in h._views, "the premise: group 1's view does not exist yet"
    x0 = rand(S, rng)
    x, y = h.create_from_numpy(x0), h.create_from_numpy(np.full(S, 7.0))
    with h.capture() as g:
        fork = h.record_event()
        h1 = h.with_streams(1)          # made here, inside the capture
        h1.wait_event(fork)
        h1.axpby(1.0, x, 1.0, y)        # y += x
        h.wait_for(h1)
    np.testing.assert_array_equal(h.get_numpy_copy(y), np.full(S, 7.0))
    assert g.groups == (0, 1) and g.ops == 1
    x64 = h.get_numpy_copy(x).astype(np.float64)
    for k in (1, 2):
        g.replay()
        h.synchronize_all_streams()
        np.testing.assert_allclose(h.get_numpy_copy(y), 7.0 + k * x64, rtol=1e-6)


def test_events_recorded_inside_have_no_host_state(handler):
    with pytest.raises(CaptureError, match="query"):
        with handler.capture():
            handler.record_event().synchronize()


# ============================================================================ forbidden calls
FORBIDDEN = {
    "get_numpy_copy": lambda h, a: h.get_numpy_copy(a),
    "get_numpy_copy_async": lambda h, a: h.get_numpy_copy_async(a),
    "is_fully_finite": lambda h, a: h.is_fully_finite(a),
    "synchronize": lambda h, a: h.synchronize(),
    "synchronize_all_streams": lambda h, a: h.synchronize_all_streams(),
    "set_from_numpy": lambda h, a: h.set_from_numpy(a, np.zeros(a.shape)),
    "allocate": lambda h, a: h.allocate((3,)),
    "zeros": lambda h, a: h.zeros((3,)),
    "ones": lambda h, a: h.ones((3,)),
    "create_from_numpy": lambda h, a: h.create_from_numpy(np.zeros(3)),
    "create_from_device_array": lambda h, a: h.create_from_device_array(a),
    "prefetch": lambda h, a: h.prefetch([np.zeros(3)]),
    "pin": lambda h, a: h.pin(np.zeros(3)),
    "close": lambda h, a: h.close(),
    "capture": lambda h, a: h.capture().__enter__(),
}


@pytest.mark.parametrize("call", sorted(FORBIDDEN))
def test_forbidden_call_raises_and_writes_nothing(handler, rng, call):
    x0 = rand(S, rng)
    x = handler.create_from_numpy(x0)
    with pytest.raises(CaptureError) as info:
        with handler.capture():
            handler.mult_st(2.0, x, x)          # recorded, never run
            FORBIDDEN[call](handler, x)
    assert info.value.op == call, info.value
    assert call in str(info.value)
    np.testing.assert_array_equal(handler.get_numpy_copy(x), x0.astype(handler.dtype))
    handler.mult_st(2.0, x, x)                   # the handler is still usable
    np.testing.assert_array_equal(handler.get_numpy_copy(x), 2 * x0.astype(handler.dtype))


def test_exception_inside_capture_discards_it(handler, rng):
    x = handler.create_from_numpy(rand(S, rng))
    wrong = handler.zeros((2, 7))
    g = handler.capture()
    with pytest.raises(ValueError, match="add_tt"):
        with g:
            handler.relu(x, x)
            handler.add_tt(x, wrong, x)
    with pytest.raises(CaptureError, match="never captured"):
        g.replay()
    handler.relu(x, x)


def test_replay_inside_a_capture_and_capture_twice_raise(handler, rng):
    x = handler.create_from_numpy(rand(S, rng))
    g = handler.capture(lambda: handler.relu(x, x))
    with pytest.raises(CaptureError, match="replay"):
        with handler.capture():
            g.replay()
    with pytest.raises(CaptureError, match="captured already"):
        with g:
            pass


def test_replay_after_close_raises(make_handler, handler_id, rng):
    h = make_handler(handler_id, seed=1)
    x = h.create_from_numpy(rand(S, rng))
    g = h.capture(lambda: h.relu(x, x))
    g.replay()
    h.close()
    h.close()
    with pytest.raises(CaptureError, match="closed"):
        g.replay()
    with pytest.raises(CaptureError, match="closed"):
        h.capture(lambda: None)


def _capture_with_temporaries(h, a0, b0):
    """A graph over arrays that only the graph references afterwards."""
    a, b = h.create_from_numpy(a0), h.create_from_numpy(b0)
    tmp, out = h.zeros(S), h.zeros(S)

    def step():
        h.add_tt(a, b, tmp)
        h.copy_to(tmp, out)
    return h.capture(step), out


def test_graph_keeps_its_arrays_alive(handler, rng):
    a0, b0 = rand(S, rng), rand(S, rng)
    g, out = _capture_with_temporaries(handler, a0, b0)
    gc.collect()
    # New arrays of the same size would take over freed memory.
    others = [handler.create_from_numpy(np.full(S, 9.0)) for _ in range(6)]
    g.replay()
    want = a0.astype(handler.dtype) + b0.astype(handler.dtype)
    np.testing.assert_array_equal(handler.get_numpy_copy(out), want)
    for o in others:
        np.testing.assert_array_equal(handler.get_numpy_copy(o), np.full(S, 9.0))


# ============================================================================ values per replay
def test_device_scalars_are_read_at_replay(handler, rng):
    x0 = rand(S, rng)
    x, y = handler.create_from_numpy(x0), handler.zeros(S)
    alpha, beta = handler.create_from_numpy([2.0]), handler.create_from_numpy(np.zeros((1, 1)))
    g = handler.capture(lambda: handler.axpby(alpha, x, beta, y))
    want = np.zeros(S, handler.dtype)
    for a, b in ((2.0, 0.0), (-1.0, 1.0), (0.5, 3.0)):
        handler.fill(alpha, a)
        handler.fill(beta, b)
        g.replay()
        want = handler.dtype.type(a) * x0.astype(handler.dtype) + handler.dtype.type(b) * want
        np.testing.assert_allclose(handler.get_numpy_copy(y), want, rtol=1e-6)


def test_device_scalar_checks(handler):
    y = handler.zeros(S)
    with pytest.raises(ValueError, match="one element"):
        handler.axpby(handler.zeros((2,)), y, 1.0, y)
    with pytest.raises(ValueError, match="overlap"):
        handler.axpby(y.reshape(y.size)[:1], y, 1.0, y)


def test_random_ops_draw_fresh_values_in_the_eager_sequence(make_handler, handler_id):
    eager, captured = make_handler(handler_id, seed=42), make_handler(handler_id, seed=42)
    outs = {h: (h.zeros((37,)), h.zeros((6, 5))) for h in (eager, captured)}

    def step(h):
        g_out, m_out = outs[h]
        h.fill_gaussian(0.5, 2.0, g_out)
        h.generate_probability_mask(m_out, 0.3)

    g = captured.capture(lambda: step(captured))
    seen = []
    for i in range(4):
        step(eager)
        g.replay()
        if i == 2:     # eager random work between replays continues the sequence
            for h in (eager, captured):
                h.fill_gaussian(0.0, 1.0, outs[h][0])
        for e, c in zip(outs[eager], outs[captured]):
            np.testing.assert_array_equal(captured.get_numpy_copy(c), eager.get_numpy_copy(e))
        seen.append(captured.get_numpy_copy(outs[captured][0]))
    assert not np.array_equal(seen[0], seen[1]), "a replay repeated the previous values"


# ============================================================================ models
def _dropout_net(h, seed=0):
    return Sequential(h, [FullyConnected(6, 16), ReLU(), Dropout(0.3), FullyConnected(16, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


MODELS = {
    "mlp": (mlp, lambda rng: (rand((8, 6), rng), rng.integers(0, 3, (8, 1)).astype(float))),
    "lstm-groups": (lstm_net, lambda rng: toy_sequences(rng, n=8)),
    "dropout": (_dropout_net,
                lambda rng: (rand((8, 6), rng), rng.integers(0, 3, (8, 1)).astype(float))),
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_captured_training_equals_eager_bit_for_bit(make_handler, handler_id, rng, model):
    build, data = MODELS[model]
    x0, y0 = data(rng)
    params = []
    for captured in (False, True):
        h = make_handler(handler_id, seed=7)
        if model == "lstm-groups":
            need_groups(h, 3)
        net = build(h, seed=3)
        opt = SGD(net.parameters, lr=0.2, momentum=0.5)
        x, y = h.create_from_numpy(x0), h.create_from_numpy(y0)

        def step():
            net.train_step(x, y)
            opt.step()
        step()                          # warm-up: allocates the layers' buffers
        if captured:
            g = h.capture(step)
            if model == "lstm-groups":
                assert len(g.groups) > 1, "the LSTM did not use stream groups"
        for i in range(10):
            if i == 5:
                opt.lr = 0.05           # a schedule: the graph sees the new rate
            g.replay() if captured else step()
        params.append(h.get_numpy_copy(net.params))
    np.testing.assert_array_equal(params[1], params[0])
    assert np.isfinite(params[0]).all()


def test_trainer_graph_matches_eager(make_handler, handler_id, rng):
    x, y = rand((50, 6), rng), rng.integers(0, 3, (50, 1)).astype(float)  # last batch of 2
    results = []
    for graph in (False, True):
        h = make_handler(handler_id, seed=2)
        net = _dropout_net(h, seed=1)
        trainer = Trainer(net, SGD(net.parameters, lr=0.1), batch_size=8, progress=False,
                          graph=graph)
        hist = trainer.fit(x, y, epochs=2)
        results.append((h.get_numpy_copy(net.params), hist.step_losses))
        # one graph per prefetch destination, each replaying in place
        assert len(trainer._step.captured) == (2 if graph else 0)
    np.testing.assert_array_equal(results[1][0], results[0][0])
    assert results[1][1] == results[0][1]


def test_trainer_falls_back_to_eager_with_a_warning(handler, rng):
    class Peek(ReLU):
        """A layer that reads its input on the host every step: not capturable."""

        def forward(self, x, training=True):
            self.h.is_fully_finite(x)
            return super().forward(x, training)

    net = Sequential(handler, [FullyConnected(6, 4), Peek(), FullyConnected(4, 3)],
                     SoftmaxCrossEntropy(), seed=0)
    x, y = rand((24, 6), rng), rng.integers(0, 3, (24, 1)).astype(float)
    trainer = Trainer(net, SGD(net.parameters), batch_size=8, progress=False, graph=True)
    with pytest.warns(UserWarning, match="training eagerly.*is_fully_finite"):
        hist = trainer.fit(x, y, epochs=1)
    assert len(hist.step_losses) == 3 and np.isfinite(hist.step_losses).all()


# ============================================================================ DebugHandler
def test_debug_handler_checks_ops_as_they_are_captured(handler, rng):
    need_groups(handler, 2)
    debug = DebugHandler(handler)
    d1 = debug.with_streams(1)
    x = debug.create_from_numpy(rand(S, rng))
    y = debug.zeros(S)
    with pytest.raises(StreamHazardError):
        with debug.capture():
            d1.wait_for(debug)
            d1.relu(x, y)
            debug.add_tt(y, x, x)       # reads y written on group 1, no wait
    debug.synchronize_all_streams()     # the tracker still counts the failed capture's ops
    with pytest.raises(ValueError, match="partially overlaps"):
        with debug.capture():
            flat = x.reshape(x.size)
            debug.add_tt(flat[:10], flat[:10], flat[1:11])
    g = debug.capture(lambda: debug.relu(x, y))
    g.replay()
    np.testing.assert_array_equal(debug.get_numpy_copy(y),
                                  np.maximum(debug.get_numpy_copy(x), 0))


# ============================================================================ random programs
PROGRAMS, CHUNKS = 120, 6


def run_captured(handler, arrays, program, graph=None, stalls=None):
    """Capture ``program``'s schedule once (uploads stay outside, host waits
    become waits between groups), then upload its data and replay; return
    host copies of the arrays and the graph."""
    views = [handler.with_streams(k) for k in range(GROUPS)]
    handler.synchronize_all_streams()
    for name, data in program.init.items():
        handler.set_from_numpy(arrays[name], data)
    if graph is None:
        def value(a):
            if isinstance(a, Init):
                return None
            return arrays[a] if isinstance(a, str) else a

        def record():
            events, joined = {}, {0}

            def join(g):
                if g not in joined:
                    views[g].wait_for(handler)
                    joined.add(g)
            for it in program.items:
                if isinstance(it, Step):
                    join(it.group)
                    h = views[it.group]
                    for method, args, kwargs in it.calls:
                        if method != "set_from_numpy":
                            getattr(h, method)(*map(value, args), **kwargs)
                    if it.index in program.record_after:
                        events[it.index] = h.record_event()
                elif isinstance(it, Stall):
                    if stalls is not None:
                        join(it.group)
                        big, outs = stalls
                        views[it.group].dot_mm(big, big, outs[it.group])
                elif it.kind == "wait_event":
                    join(it.group)
                    views[it.group].wait_event(events[it.step])
                elif it.kind == "wait_for":
                    join(it.group)
                    views[it.group].wait_for(views[it.other])
                else:   # a host wait: every group of the capture waits for the one(s) named
                    waited = sorted(joined) if it.kind == "synchronize_all" else [it.other]
                    for g in sorted(joined):
                        for o in waited:
                            if o != g and o in joined:
                                views[g].wait_for(views[o])
            for g in sorted(joined - {0}):
                handler.wait_for(views[g])
        graph = handler.capture(record)
    graph.replay()
    return {name: handler.get_numpy_copy(a) for name, a in arrays.items()}, graph


def test_init_uploads_are_the_only_host_calls_in_programs():
    """run_captured skips set_from_numpy calls: they must be the uploads."""
    for seed in range(20):
        for step in make_program(seed).steps:
            for method, args, _ in step.calls:
                if method == "set_from_numpy":
                    assert isinstance(args[1], Init)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_captured_equal_serial_run(handler, rng, chunk):
    need_groups(handler, GROUPS)
    arrays = allocate_pool(handler)
    stalls = make_stalls(handler, rng)
    for seed in program_seeds(rng, PROGRAMS // CHUNKS):
        program = make_program(seed)
        want = run_program(handler, arrays, program, serial=True)
        got, graph = run_captured(handler, arrays, program, stalls=stalls)
        again, _ = run_captured(handler, arrays, program, graph)   # a second replay
        for result in (got, again):
            problems = differences(result, want)
            if problems:
                pytest.fail(f"{handler!r}: the captured program differs from the serial "
                            f"run (program seed {seed}):\n  " + "\n  ".join(problems)
                            + "\n" + program.listing(), pytrace=False)
        assert set(want) == set(POOL)
        graph.close()
