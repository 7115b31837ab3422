"""Every handler works from any thread: ops issued from several threads on
several stream groups give exact results, and a prefetch loop can be consumed
on a thread other than the one that made the handler."""
import threading

import numpy as np
import pytest

from handlers import DebugHandler
from helpers import rand

THREADS, OPS_PER_THREAD, GROUPS = 8, 2000, 4


def run_threads(target, n):
    """Run ``target(i)`` on ``n`` threads at once; re-raise the first error."""
    errors = []
    start = threading.Barrier(n)

    def body(i):
        try:
            start.wait()
            target(i)
        except BaseException as e:  # reported on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def _count_up(h, i, results):
    """On its own group: 2000 ops that each add 1 to a fresh array, through
    four different ops (each result is exact in float32)."""
    view = h.with_streams(i % GROUPS)
    x = view.zeros((513,))
    one = view.ones((513,))
    steps = [lambda: view.add_st(1.0, x, x), lambda: view.add_tt(x, one, x),
             lambda: view.axpby(1.0, one, 1.0, x), lambda: view.mult_add_st(1.0, one, x)]
    for k in range(OPS_PER_THREAD):
        steps[k % 4]()
    results[i] = view.get_numpy_copy(x)


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "debug"])
def test_ops_from_eight_threads_over_four_groups(handler, wrapped):
    if handler.num_stream_groups < GROUPS:
        pytest.skip(f"needs {GROUPS} stream groups")
    h = DebugHandler(handler) if wrapped else handler
    results = [None] * THREADS
    run_threads(lambda i: _count_up(h, i, results), THREADS)
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got, np.full(513, float(OPS_PER_THREAD)),
                                      err_msg=f"thread {i}")


def test_prefetch_consumed_on_another_thread(handler, rng):
    data = [rand((16, 7), rng) for _ in range(9)]
    sums = {}

    def consume(_):
        out = handler.zeros(())
        for k, batch in enumerate(handler.prefetch(data, depth=2)):
            handler.sum_t(batch, None, out)
            sums[k] = float(handler.get_numpy_copy(out))

    run_threads(consume, 1)
    want = [float(d.astype(handler.dtype).astype(np.float64).sum()) for d in data]
    assert sorted(sums) == list(range(len(data)))
    np.testing.assert_allclose([sums[k] for k in range(len(data))], want, rtol=1e-5, atol=1e-5)


def test_new_thread_after_others_ended(handler):
    """A thread that used a handler and ended leaves it usable to the next
    (the context it made current is released with the thread)."""
    results = [None]
    for _ in range(3):
        run_threads(lambda i: _count_up(handler, 0, results), 1)
        np.testing.assert_array_equal(results[0], np.full(513, float(OPS_PER_THREAD)))
    a = handler.create_from_numpy(np.arange(4.0))
    handler.add_st(1.0, a, a)
    np.testing.assert_array_equal(handler.get_numpy_copy(a), [1.0, 2.0, 3.0, 4.0])
