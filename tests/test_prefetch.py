"""Double-buffered input (``prefetch``), ``pin`` and asynchronous downloads,
per handler, plus GPU-only checks of overlap and of resource stability."""
import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest


def _batches(rng, n, rows=6, cols=5, last=None):
    out = [rng.standard_normal((rows, cols)) for _ in range(n)]
    if last:
        out.append(rng.standard_normal((last, cols)))
    return out


def _wait_threads(before, timeout=5.0):
    deadline = time.monotonic() + timeout
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count()


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_batches_arrive_intact_and_in_order(handler, rng, depth):
    data = _batches(rng, 9, last=2)
    seen = []
    for xb in handler.prefetch(data, depth=depth):
        assert isinstance(xb, handler.array_type)
        # A computation on the batch, so that the batch is used on the device.
        out = handler.allocate(xb.shape)
        handler.mult_st(2.0, xb, out)
        seen.append(handler.get_numpy_copy(out) / 2.0)
    assert len(seen) == len(data)
    for got, want in zip(seen, data):
        np.testing.assert_array_equal(got, want.astype(handler.dtype))


def test_tuples_and_generators(handler, rng):
    xs = _batches(rng, 5, last=3)
    ys = [rng.integers(0, 10, (x.shape[0], 1)) for x in xs]
    src = ((x, y) for x, y in zip(xs, ys))          # a generator, ints in y
    n = 0
    for i, (xb, yb) in enumerate(handler.prefetch(src, depth=2)):
        np.testing.assert_array_equal(handler.get_numpy_copy(xb), xs[i].astype(handler.dtype))
        np.testing.assert_array_equal(handler.get_numpy_copy(yb), ys[i].astype(handler.dtype))
        n += 1
    assert n == len(xs)


def test_a_batch_stays_valid_until_the_next_is_requested(handler, rng):
    data = _batches(rng, 8)
    it = handler.prefetch(data, depth=3)
    first = next(it)
    time.sleep(0.05)       # let the reader and uploads run ahead
    np.testing.assert_array_equal(handler.get_numpy_copy(first), data[0].astype(handler.dtype))
    rest = [handler.get_numpy_copy(b) for b in it]
    assert len(rest) == 7


def test_source_exception_reaches_consumer_with_traceback(handler, rng):
    def source():
        yield rng.standard_normal((4, 4))
        yield rng.standard_normal((4, 4))
        raise KeyError("broken source")

    before = threading.active_count()
    got = 0
    with pytest.raises(KeyError, match="broken source") as info:
        for _ in handler.prefetch(source()):
            got += 1
    assert got == 2
    assert any(entry.name == "source" for entry in info.traceback)
    assert _wait_threads(before) == before


def test_early_break_and_close_stop_the_thread(handler, rng):
    data = _batches(rng, 50)
    before = threading.active_count()
    for i, _ in enumerate(handler.prefetch(data, depth=2)):
        if i == 3:
            break
    assert _wait_threads(before) == before
    it = handler.prefetch(iter(data), depth=4)
    next(it)
    it.close()
    assert _wait_threads(before) == before


def _bounded(fn, seconds=60):
    """Run ``fn()`` on a daemon thread and return its result, failing the
    test (instead of hanging the run) if it has not finished in ``seconds``."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:   # re-raised on the test's thread
            box["error"] = e
    worker = threading.Thread(target=run, name="prefetch-test-consumer", daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"prefetch did not finish within {seconds} s (hangs)"
    if "error" in box:
        raise box["error"]
    return box["result"]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_batch_width_changing_mid_stream(handler, rng, depth):
    """Batches whose trailing shape changes mid-stream ((16, 7) then (16, 9),
    back to 7, with a shorter last batch) arrive intact and in order, the
    labels beside them too, and the loop ends: staging slots of the old
    width are dropped and new ones made, not waited for forever."""
    widths = [7] * 4 + [9] * 5 + [7] * 3
    xs = [rng.standard_normal((16, w)) for w in widths] + [rng.standard_normal((5, 7))]
    ys = [rng.integers(0, 10, (x.shape[0], 1)) for x in xs]
    before = threading.active_count()

    def consume():
        seen = []
        for xb, yb in handler.prefetch(list(zip(xs, ys)), depth=depth):
            out = handler.allocate(xb.shape)
            handler.mult_st(2.0, xb, out)                # used by an op before the next
            seen.append((handler.get_numpy_copy(out).astype(np.float64) / 2.0,
                         handler.get_numpy_copy(yb)))
        return seen
    seen = _bounded(consume)
    assert len(seen) == len(xs)
    for (got_x, got_y), x, y in zip(seen, xs, ys):
        np.testing.assert_array_equal(got_x, x.astype(handler.dtype).astype(np.float64))
        np.testing.assert_array_equal(got_y, y.astype(handler.dtype))
    assert _wait_threads(before) == before


# Staging copies of at least PARALLEL_BYTES are split across threads.  Eight
# threads whatever the machine, of which the Python workers' path
# (converting copies; byte copies without the extension) takes four, so
# that the rows split unevenly (401 = 100 + 100 + 100 + 101) and the
# workers exist even on one core.
@pytest.fixture
def parallel_staging(monkeypatch):
    from handlers import prefetch
    monkeypatch.setattr(prefetch, "COPY_THREADS", 8)
    monkeypatch.setattr(prefetch, "PY_COPY_THREADS", 4)
    monkeypatch.setattr(prefetch, "_hostcopy", None)
    return prefetch


def _hostcopy():
    from handlers import prefetch
    if prefetch._hostcopy is None:
        pytest.skip("handlers._hostcopy is not built (python setup.py build_ext --inplace)")
    return prefetch._hostcopy


def test_hostcopy_matches_numpy_on_any_length_and_split(rng):
    ext = _hostcopy()
    for n in (0, 1, 63, 64, 65, 4097, 1_000_003):
        src = rng.integers(0, 256, n, dtype=np.uint8)
        for threads in (1, 2, 3, 7, ext.MAX_THREADS):
            dst = np.zeros(n + 2, np.uint8)   # the bytes beyond n stay untouched
            ext.copy(dst.ctypes.data, src.ctypes.data, n, threads)
            np.testing.assert_array_equal(dst[:n], src)
            assert not dst[n:].any()


def test_hostcopy_refuses_bad_calls():
    ext = _hostcopy()
    a, b = np.zeros(100, np.uint8), np.zeros(100, np.uint8)
    with pytest.raises(ValueError, match="threads must be 1 to"):
        ext.copy(a.ctypes.data, b.ctypes.data, 100, 0)
    with pytest.raises(ValueError, match="threads must be 1 to"):
        ext.copy(a.ctypes.data, b.ctypes.data, 100, ext.MAX_THREADS + 1)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        ext.copy(a.ctypes.data, b.ctypes.data, -1, 2)
    with pytest.raises(ValueError, match="overlap"):
        ext.copy(a.ctypes.data + 10, a.ctypes.data, 50, 2)
    with pytest.raises(ValueError, match="null address"):
        ext.copy(0, b.ctypes.data, 10, 2)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        ext.copy(a.ctypes.data, b.ctypes.data, 10)
    assert not a.any()


def test_hostcopy_keeps_its_workers_and_copies_from_several_threads(rng):
    # Two Python threads copying at once (the reader and the consumer may
    # both stage) share the one pool: every copy arrives whole.
    ext = _hostcopy()
    a, b = np.zeros(1, np.uint8), np.ones(1, np.uint8)
    ext.copy(a.ctypes.data, b.ctypes.data, 1, 5)
    assert ext.workers() >= 4
    srcs = [rng.integers(0, 256, 3_000_001 + 17 * i, dtype=np.uint8) for i in range(2)]
    bad = []

    def copies(src, threads):
        for _ in range(20):
            dst = np.zeros(src.size + 1, np.uint8)
            ext.copy(dst.ctypes.data, src.ctypes.data, src.size, threads)
            if not (np.array_equal(dst[:-1], src) and dst[-1] == 0):
                bad.append(threads)
    runs = [threading.Thread(target=copies, args=(s, t)) for s, t in zip(srcs, (3, 7))]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    assert not bad


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_hostcopy_works_in_a_forked_child(rng):
    # A child has none of its parent's worker threads: it must start its own
    # rather than wait for threads that do not exist.
    ext = _hostcopy()
    src = rng.integers(0, 256, 2_000_003, dtype=np.uint8)
    warm = np.empty_like(src)   # held: the copy writes through its address
    ext.copy(warm.ctypes.data, src.ctypes.data, src.size, 4)   # the parent's workers
    with warnings.catch_warnings():   # Python 3.12 warns of fork() with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:   # the child: report through the exit status only
        ok = False
        try:
            dst = np.zeros_like(src)
            ext.copy(dst.ctypes.data, src.ctypes.data, src.size, 4)
            ok = bool(np.array_equal(dst, src)) and ext.workers() == 3
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's copy did not finish within 60 s")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_big_byte_copies_staged_without_python_workers(handler, rng, monkeypatch):
    from handlers import prefetch
    ext = _hostcopy()
    monkeypatch.setattr(prefetch, "COPY_THREADS", 4)
    cols = 1000
    sizes = [401] * 5 + [301]   # uneven parts, a smaller last batch
    assert min(sizes) * cols * handler.dtype.itemsize >= prefetch.PARALLEL_BYTES
    xs = [rng.standard_normal((r, cols)).astype(handler.dtype) for r in sizes]
    calls, copy = [], ext.copy

    def recorded(dst, src, nbytes, threads):   # the extension's copy, recorded
        calls.append((nbytes, threads))
        copy(dst, src, nbytes, threads)
    monkeypatch.setattr(ext, "copy", recorded)
    n = 0
    for i, xb in enumerate(handler.prefetch(xs, depth=2)):
        assert not _stage_threads()
        np.testing.assert_array_equal(handler.get_numpy_copy(xb), xs[i])
        n += 1
    assert n == len(sizes)
    assert sorted(set(calls)) == sorted({(r * cols * handler.dtype.itemsize, 4) for r in sizes})


def _stage_threads():
    return [t for t in threading.enumerate() if t.name.startswith("streamhandlers-stage")]


def test_big_batches_staged_by_several_threads_arrive_intact(handler, rng, parallel_staging):
    cols = 1000
    sizes = [401] * 5 + [301]   # a smaller last batch, still over the threshold
    assert min(sizes) * cols * 4 >= parallel_staging.PARALLEL_BYTES
    # float64 (converted on float32 handlers) and not contiguous, int32, bool
    xs = [rng.standard_normal((r, 2 * cols))[:, ::2] for r in sizes]
    ys = [rng.integers(-1000, 1000, (r, cols), dtype=np.int32) for r in sizes]
    zs = [rng.random((r, cols)) < 0.5 for r in sizes]
    before = threading.active_count()
    workers = 0
    n = 0
    for i, (xb, yb, zb) in enumerate(handler.prefetch(zip(xs, ys, zs), depth=2)):
        workers = max(workers, len(_stage_threads()))
        for got, want in ((xb, xs[i]), (yb, ys[i]), (zb, zs[i])):
            assert got.shape == want.shape
            np.testing.assert_array_equal(handler.get_numpy_copy(got),
                                          want.astype(handler.dtype))
        n += 1
    assert n == len(sizes)
    assert 1 <= workers <= 3       # split, at most four ways; the caller copies a part too
    assert not _stage_threads()    # joined when the loop ended
    assert _wait_threads(before) == before


def test_staging_threads_end_with_the_loop(handler, rng, parallel_staging):
    data = [rng.standard_normal((400, 1000)) for _ in range(6)]
    before = threading.active_count()
    for _ in range(5):
        for i, _ in enumerate(handler.prefetch(data, depth=2)):
            assert _stage_threads()    # the first batches are big: the workers exist
            if i == 3:
                break
        assert not _stage_threads()
        assert threading.active_count() == before
        it = handler.prefetch(iter(data), depth=4)
        next(it)
        assert _stage_threads()
        it.close()
        assert not _stage_threads()
        assert threading.active_count() == before
        assert sum(1 for _ in handler.prefetch(data, depth=1)) == len(data)
        assert not _stage_threads()
        assert threading.active_count() == before


def test_a_failing_staging_copy_reaches_consumer_with_traceback(handler, rng, parallel_staging,
                                                                 monkeypatch):
    data = [rng.standard_normal((400, 1000)) for _ in range(10)]
    copy_rows = parallel_staging._copy_rows

    def failing_copy(dst, src, lo, hi):
        # batch 6 is staged by the reader (only the first depth + 1 may not be)
        if src is data[6] and threading.current_thread().name.startswith("streamhandlers-stage"):
            raise MemoryError("chunk copy failed")
        copy_rows(dst, src, lo, hi)

    monkeypatch.setattr(parallel_staging, "_copy_rows", failing_copy)
    before = threading.active_count()
    got = []
    with pytest.raises(MemoryError, match="chunk copy failed") as info:
        for xb in handler.prefetch(data, depth=1):
            got.append(handler.get_numpy_copy(xb))
    assert len(got) == 6
    for g, want in zip(got, data):
        np.testing.assert_array_equal(g, want.astype(handler.dtype))
    assert any(entry.name == "failing_copy" for entry in info.traceback)
    assert not _stage_threads()
    assert _wait_threads(before) == before


def test_bad_input(handler):
    with pytest.raises(ValueError, match="prefetch"):
        handler.prefetch([], depth=0)
    with pytest.raises(TypeError, match="prefetch"):
        list(handler.prefetch([np.array(["a", "b"])]))
    assert list(handler.prefetch([])) == []
    with pytest.raises(TypeError, match="pin"):
        handler.pin([1.0, 2.0])
    with pytest.raises(ValueError, match="pin"):
        handler.pin(np.ones((4, 4))[:, ::2])
    with pytest.raises(ValueError, match="empty_pinned"):
        handler.empty_pinned((2, -1))
    a = handler.zeros((3, 4))
    with pytest.raises(TypeError, match="get_numpy_copy_async"):
        handler.get_numpy_copy_async([[0.0] * 4] * 3)
    with pytest.raises(TypeError, match="get_numpy_copy_async"):
        handler.get_numpy_copy_async(a, out=np.zeros((3, 4), np.int32))
    with pytest.raises(ValueError, match="get_numpy_copy_async"):
        handler.get_numpy_copy_async(a, out=np.zeros((4, 3), handler.dtype))


# ------------------------------------------------------------------ into
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_into_yields_the_destinations_for_full_batches(handler, rng, depth):
    xs = _batches(rng, 7, last=2)
    ys = [rng.standard_normal((x.shape[0], 1)) for x in xs]
    dests = [(handler.allocate((6, 5)), handler.allocate((6, 1))) for _ in range(depth + 1)]
    seen = []
    for i, (xb, yb) in enumerate(handler.prefetch(zip(xs, ys), depth, into=dests)):
        full = xs[i].shape[0] == 6
        hit = [k for k, (dx, dy) in enumerate(dests) if xb is dx and yb is dy]
        assert len(hit) == (1 if full else 0), "a full batch lands in one destination"
        np.testing.assert_array_equal(handler.get_numpy_copy(xb), xs[i].astype(handler.dtype))
        np.testing.assert_array_equal(handler.get_numpy_copy(yb), ys[i].astype(handler.dtype))
        seen += hit
    assert len(seen) == 7 and len(set(seen)) == min(depth + 1, 7)   # used in turn


def test_into_feeds_graphs_captured_on_each_destination(handler, rng):
    """Replays read each batch where the upload put it; an upload into a
    destination waits for the replay that read it last (else the sum is off)."""
    n, depth = 40, 2
    data = [rng.standard_normal((64, 33)) for _ in range(n)]
    dests = [handler.allocate((64, 33)) for _ in range(depth)]
    acc = handler.zeros((64, 33))
    scratch = handler.allocate((64, 33))
    graphs = {}
    # Each graph adds its destination (through a sigmoid, so a stale or torn
    # batch changes the result) into acc.
    for k, d in enumerate(dests):
        def step(d=d):
            handler.sigmoid(d, scratch)
            handler.add_tt(acc, scratch, acc)
        graphs[k] = handler.capture(step)
    handler.fill(acc, 0.0)
    for xb in handler.prefetch(data, depth, into=dests):
        k = next(k for k, d in enumerate(dests) if d is xb)
        graphs[k].replay()
    want = sum(1.0 / (1.0 + np.exp(-x.astype(handler.dtype).astype(np.float64))) for x in data)
    tol = 1e-4 if handler.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(handler.get_numpy_copy(acc), want, rtol=tol, atol=tol)


def test_into_bad_arguments(handler, rng):
    data = _batches(rng, 3)
    a, b = handler.allocate((6, 5)), handler.allocate((6, 5))
    with pytest.raises(ValueError, match="into has 1 destination"):
        handler.prefetch(data, 2, into=[a])
    with pytest.raises(TypeError, match="into must be a list"):
        handler.prefetch(data, 1, into=3)
    with pytest.raises(ValueError, match="overlap"):
        handler.prefetch(data, 2, into=[a, a])
    with pytest.raises(ValueError, match="as many arrays"):
        handler.prefetch(data, 2, into=[(a,), (b, b)])
    with pytest.raises(TypeError, match="prefetch"):
        handler.prefetch(data, 1, into=[np.zeros((6, 5))] if handler.array_type is not np.ndarray
                         else [np.zeros((6, 5), np.int32)])


def test_pinned_slices_arrive_intact(handler, rng):
    dataset = handler.pin(rng.standard_normal((40, 7)).astype(handler.dtype))
    seen = [handler.get_numpy_copy(b) for b in
            handler.prefetch((dataset[i:i + 8] for i in range(0, 40, 8)), depth=2)]
    np.testing.assert_array_equal(np.concatenate(seen), dataset)


def test_get_numpy_copy_async(handler, rng):
    data = rng.standard_normal((33, 17))
    a = handler.create_from_numpy(data)
    out = handler.allocate(a.shape)
    handler.mult_st(3.0, a, out)
    pending = handler.get_numpy_copy_async(out)
    np.testing.assert_allclose(pending.result(), 3.0 * data.astype(handler.dtype), rtol=1e-6)
    pinned = handler.empty_pinned((33, 17))
    assert pinned.dtype == handler.dtype and pinned.shape == (33, 17)
    pinned.fill(np.nan)
    handler.add_st(1.0, a, out)
    got = handler.get_numpy_copy_async(out, out=pinned).result()
    assert got is pinned
    np.testing.assert_allclose(pinned, data.astype(handler.dtype) + 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="get_numpy_copy_async"):
        handler.get_numpy_copy_async(out, out=np.empty((2, 2), handler.dtype))


def _gpu_only(handler):
    if type(handler).__name__ != "PyCudaHandler":
        pytest.skip("GPU-only check")


def _overlaps(intervals, others):
    """How many of ``intervals`` share some time with one of ``others``."""
    return sum(any(a < d and c < b for c, d in others) for a, b in intervals)


def test_uploads_overlap_compute(handler, rng, monkeypatch):
    """Event order, not wall time: prefetched uploads run while gemms run.

    Timing events are recorded on the device around every upload (on the
    upload stream) and every gemm (on the group's stream); an upload overlaps
    compute when its interval intersects a gemm's.  The serial path (uploads on
    the compute stream) is the control: there the same check must find none.
    """
    _gpu_only(handler)
    from handlers.cuda import kernel_loader
    ext = kernel_loader.require()     # timing events and copies, on stream handles
    n, steps = 2048, 12
    w = handler.create_from_numpy(rng.standard_normal((n, n)) / n)
    data = handler.pin(rng.standard_normal((steps, n, n)).astype(handler.dtype))
    y = handler.allocate((n, n))
    stream = handler.stream.handle
    uploads, gemms = [], []

    def traced(record_to, fn, s):
        begin, end = ext.timing_event_new(), ext.timing_event_new()
        ext.record(begin, s)
        fn()
        ext.record(end, s)
        record_to.append((begin, end))

    real_copy = ext.copy_htod

    def traced_copy(dst, src, s):
        traced(uploads, lambda: real_copy(dst, src, s), s)

    def step(xb):      # one gemm takes about as long as one upload
        traced(gemms, lambda: handler.dot_mm(xb, w, y), stream)

    def measure(run):
        uploads.clear(), gemms.clear()
        ref = ext.timing_event_new()
        ext.record(ref, stream)
        run()
        handler.synchronize_all_streams()
        span = [[(ext.event_elapsed(ref, a), ext.event_elapsed(ref, b)) for a, b in x]
                for x in (uploads, gemms)]
        for ev in [ref, *(e for x in (uploads, gemms) for pair in x for e in pair)]:
            ext.event_free(ev)
        assert all(b > a for a, b in span[1]), span
        return span

    def serial():
        for i in range(steps):
            traced(uploads, lambda: handler.set_from_numpy(xb, data[i]), stream)
            step(xb)

    def overlapped():
        for xb in handler.prefetch((data[i] for i in range(steps)), depth=2):
            step(xb)

    xb = handler.allocate((n, n))
    ups, gs = measure(serial)
    assert len(ups) == len(gs) == steps and _overlaps(ups, gs) == 0, (ups, gs)
    # Each prefetch's transfer takes the extension's copy when it starts.
    monkeypatch.setattr(ext, "copy_htod", traced_copy)
    overlapped()                  # warm-up: slots and events allocated
    ups, gs = measure(overlapped)
    assert len(ups) == len(gs) == steps, (ups, gs)
    # The first upload has no gemm to hide behind; most of the others should.
    assert _overlaps(ups, gs) >= (steps - 1) // 2, (ups, gs)


def test_resources_flat_over_10000_iterations(handler, rng):
    _gpu_only(handler)
    import pycuda.driver as drv
    data = [rng.standard_normal((64, 32)) for _ in range(16)]
    w = handler.create_from_numpy(rng.standard_normal((32, 8)))
    y = handler.allocate((64, 8))

    def run(iters):
        it = (data[i % 16] for i in range(iters))
        for xb in handler.prefetch(it, depth=2):
            handler.dot_mm(xb, w, y)
        handler.synchronize_all_streams()

    def snapshot():
        handler.synchronize_all_streams()
        free, _ = drv.mem_get_info()
        return (free, handler._pool.active_blocks, handler._pool.held_blocks,
                threading.active_count())

    run(200)
    before = snapshot()
    run(10000)
    after = snapshot()
    assert after[1:] == before[1:], (before, after)
    assert abs(after[0] - before[0]) < 8 << 20, (before, after)
