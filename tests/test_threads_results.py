"""Exact results from any number of threads, in every format.

Eight threads issue, over and over, every op that uses a handler's scratch
memory (NumpyHandler's per-shape buffers; a GPU stream's workspace and
intermediate buffers) on fresh random inputs of their own, two threads per
stream group, and each result is compared with a float64 NumPy reference.
A capture belongs to the thread that began it: another thread's call is
refused, never recorded.
"""
import threading

import numpy as np
import pytest

from handlers import CaptureError
from helpers import as_handler_values, rand, tolerance
from test_threads import run_threads

HALF_FORMATS = True

THREADS, ROUNDS = 8, 12


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softmax(m):
    e = np.exp(m - m.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _normalize(x, eps):
    xhat = x - x.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt((xhat * xhat).mean(axis=1, keepdims=True) + eps)
    return xhat * rstd, rstd


def _adam(g, m, v, p, t, lr=0.01, b1=0.9, b2=0.99, eps=1e-3):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return m, v, p


class Case:
    """One op on fresh random inputs: ``run(h, ins, outs)`` issues it,
    ``reference(ins)`` gives the float64 results, ``n`` the longest sum."""

    def __init__(self, name, inputs, outputs, run, reference, n=1, low=-1.0, high=1.0):
        self.name, self.inputs, self.outputs = name, inputs, outputs
        self.run, self.reference, self.n = run, reference, n
        self.low, self.high = low, high


def _cases():
    s2 = (37, 53)
    return [
        Case("mult_add_tt", [s2, s2, s2], [2], lambda h, i, o: h.mult_add_tt(i[0], i[1], o[0]),
             lambda i: [i[2] + i[0] * i[1]]),
        Case("mult_add_st", [s2, s2], [1], lambda h, i, o: h.mult_add_st(0.75, i[0], o[0]),
             lambda i: [i[1] + 0.75 * i[0]]),
        Case("axpby", [s2, s2], [1], lambda h, i, o: h.axpby(0.7, i[0], 1.3, o[0]),
             lambda i: [0.7 * i[0] + 1.3 * i[1]]),
        Case("dot_add_mm", [(24, 40), (40, 160), (24, 160)], [2],
             lambda h, i, o: h.dot_add_mm(i[0], i[1], o[0]),
             lambda i: [i[2] + i[0] @ i[1]], n=40),
        Case("elu", [s2, s2], [1], lambda h, i, o: h.elu(i[0], o[0]),
             lambda i: [np.where(i[0] > 0, i[0], np.expm1(np.minimum(i[0], 0)))]),
        Case("sigmoid_deriv", [s2, s2, s2, s2], [3],
             lambda h, i, o: h.sigmoid_deriv(i[0], i[1], i[2], o[0]),
             lambda i: [i[2] * i[1] * (1 - i[1])]),
        Case("tanh_deriv", [s2, s2, s2, s2], [3],
             lambda h, i, o: h.tanh_deriv(i[0], i[1], i[2], o[0]),
             lambda i: [i[2] * (1 - i[1] * i[1])]),
        Case("elu_deriv", [s2, s2, s2, s2], [3],
             lambda h, i, o: h.elu_deriv(i[0], i[1], i[2], o[0]),
             lambda i: [i[2] * np.where(i[0] > 0, 1.0, i[1] + 1)]),
        Case("softmax_m", [s2, s2], [1], lambda h, i, o: h.softmax_m(i[0], o[0]),
             lambda i: [_softmax(i[0])], n=s2[1]),
        Case("normalize_rows_m", [s2, s2, (s2[0], 1)], [1, 2],
             lambda h, i, o: h.normalize_rows_m(i[0], 1e-3, o[0], o[1]),
             lambda i: list(_normalize(i[0], 1e-3)), n=4 * s2[1], low=0.0, high=2.0),
        Case("normalize_rows_backward_m", [s2, (s2[0], 1), s2, s2], [3],
             lambda h, i, o: h.normalize_rows_backward_m(i[0], i[1], i[2], o[0]),
             lambda i: [i[1] * (i[2] - i[2].mean(axis=1, keepdims=True)
                                - i[0] * (i[2] * i[0]).mean(axis=1, keepdims=True))],
             n=s2[1]),
        Case("adam_update", [(301,), (1,), (301,), (301,), (301,)], [1, 2, 3, 4],
             lambda h, i, o: h.adam_update(i[0], 0.01, 0.9, 0.99, 1e-3, 0.0,
                                           o[0], o[1], o[2], o[3]),
             lambda i: [i[1] + 1, *_adam(i[0], i[2], i[3], i[4], i[1] + 1)], n=8),
        # Several runs of axes: a sum in passes through a stream's intermediates.
        Case("sum_t", [(6, 50, 7, 3), (50, 3)], [1], lambda h, i, o: h.sum_t(i[0], (0, 2), o[0]),
             lambda i: [i[0].sum(axis=(0, 2))], n=42),
        Case("mean_t", [(300, 9), (9,)], [1], lambda h, i, o: h.mean_t(i[0], 0, o[0]),
             lambda i: [i[0].mean(axis=0)], n=300),
        # Few columns over many rows: chunks joined through the workspace.
        Case("max_t", [(3000, 5), (5,)], [1], lambda h, i, o: h.max_t(i[0], 0, o[0]),
             lambda i: [i[0].max(axis=0)]),
        Case("argmax_t", [(250, 5), (5,)], [1], lambda h, i, o: h.argmax_t(i[0], 0, o[0]),
             lambda i: [i[0].argmax(axis=0).astype(np.float64)]),
    ]


def _inputs(h, case, rng):
    """Fresh random handler arrays for ``case`` and their float64 values."""
    data = []
    for k, shape in enumerate(case.inputs):
        if case.name == "adam_update" and k == 1:          # the step count
            data.append(np.array([float(rng.integers(0, 20))]))
        elif case.name == "adam_update" and k == 3:        # v >= 0
            data.append(rand(shape, rng, 0.0, 1.0))
        elif case.name in ("sigmoid_deriv",) and k == 1:   # y in (0, 1)
            data.append(rand(shape, rng, 0.0, 1.0))
        elif case.name == "normalize_rows_backward_m" and k == 1:   # rstd > 0
            data.append(rand(shape, rng, 0.5, 2.0))
        else:
            data.append(rand(shape, rng, case.low, case.high))
    if case.name == "argmax_t":   # distinct values: one right answer
        data[0] = rng.permutation(data[0].size).reshape(data[0].shape) / data[0].size - 0.5
    arrays = [h.create_from_numpy(d) for d in data]
    return arrays, [as_handler_values(h, d) for d in data]


def _close_enough(h, got, want, n):
    rtol, atol = tolerance(h, n)
    return np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=False)


@pytest.mark.timeout(600)
def test_scratch_ops_from_eight_threads(handler, rng):
    """Every op that uses scratch, on fresh random inputs per thread and
    round, two threads per stream group: each result equals the float64
    reference.  (One scratch buffer per shape for all threads gave 430 wrong
    results of 1600 for mult_add_tt alone.)"""
    groups = handler.num_stream_groups
    seeds = rng.integers(0, 2**32, THREADS)
    cases = _cases()
    wrong = []

    def body(i):
        h = handler.with_streams(i % groups)
        r = np.random.default_rng(int(seeds[i]))
        for rnd in range(ROUNDS):
            for case in cases:
                arrays, values = _inputs(h, case, r)
                outs = [arrays[k] for k in case.outputs]
                case.run(h, arrays, outs)
                for k, want in zip(case.outputs, case.reference(values)):
                    got = h.get_numpy_copy(arrays[k]).astype(np.float64)
                    if not _close_enough(h, got, np.broadcast_to(want, got.shape), case.n):
                        wrong.append(f"thread {i} round {rnd} {case.name} output {k}")

    run_threads(body, THREADS)
    assert not wrong, f"{len(wrong)} wrong results, e.g. " + "; ".join(wrong[:5])


@pytest.mark.timeout(300)
def test_random_draws_are_never_shared_between_threads(handler_id, make_handler):
    """Eight threads drawing Gaussians at once from one seeded handler get,
    between them, exactly the values one thread draws in sequence from the
    same seed: no offset is handed out twice, none is skipped."""
    n, per_thread = 1000, 12
    h = make_handler(handler_id, seed=1234)
    got = [[] for _ in range(THREADS)]

    def draw(i):
        v = h.with_streams(i % h.num_stream_groups)
        out = v.allocate((n,))
        for _ in range(per_thread):
            v.fill_gaussian(0.0, 1.0, out)
            got[i].append(v.get_numpy_copy(out))

    run_threads(draw, THREADS)
    ref = make_handler(handler_id, seed=1234)
    out = ref.allocate((n,))
    want = []
    for _ in range(THREADS * per_thread):
        ref.fill_gaussian(0.0, 1.0, out)
        want.append(ref.get_numpy_copy(out))
    got = np.sort(np.concatenate([a for t in got for a in t]).astype(np.float64))
    want = np.sort(np.concatenate(want).astype(np.float64))
    assert np.unique(want).size > 100   # a real sequence, not one value
    np.testing.assert_array_equal(got, want)


@pytest.mark.timeout(120)
def test_capture_refuses_other_threads(handler, rng):
    """While one thread captures, another thread's op on the handler (any
    group, a twin's too) raises CaptureError naming the capturing thread and
    writes nothing; the capture records only its own thread's op, and the
    other thread's op runs normally once the capture has ended."""
    a_val = rand((64,), rng)
    a = handler.create_from_numpy(a_val)
    mine = handler.create_from_numpy(np.full(64, np.nan))
    theirs = handler.create_from_numpy(rand((64,), rng))
    before = handler.get_numpy_copy(theirs)
    started, go_on = threading.Event(), threading.Event()
    seen = []

    def other(_):
        started.wait(30)
        for call in (lambda: handler.mult_st(2.0, a, theirs),
                     lambda: handler.with_streams(handler.num_stream_groups - 1)
                     .mult_st(2.0, a, theirs),
                     lambda: handler.record_event(),
                     lambda: handler.zeros((3,))):
            try:
                call()
                seen.append(None)
            except CaptureError as e:
                seen.append(str(e))
        go_on.set()

    t = threading.Thread(target=run_threads, args=(other, 1))
    t.start()
    with handler.capture() as g:
        handler.add_st(1.0, a, mine)
        started.set()
        assert go_on.wait(60), "the other thread did not finish"
    t.join(60)
    assert len(seen) == 4 and all(seen), f"calls not refused: {seen}"
    assert all(threading.main_thread().name in msg for msg in seen), seen
    assert g.ops == 1
    np.testing.assert_array_equal(handler.get_numpy_copy(theirs), before)
    assert np.isnan(handler.get_numpy_copy(mine)).all()   # recorded, not run
    g.replay()
    rtol, atol = tolerance(handler)
    np.testing.assert_allclose(handler.get_numpy_copy(mine).astype(np.float64),
                               as_handler_values(handler, a_val) + 1.0, rtol=rtol, atol=atol)
    handler.mult_st(2.0, a, theirs)                       # after the capture: runs
    np.testing.assert_allclose(handler.get_numpy_copy(theirs).astype(np.float64),
                               2.0 * as_handler_values(handler, a_val), rtol=rtol, atol=atol)
    g.close()
