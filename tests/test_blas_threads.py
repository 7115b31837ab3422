"""NumpyHandler puts BLAS on one thread for its small products and gives it
its thread counts back for a large one (handlers.blas_threads)."""
import threading

import numpy as np
import pytest

from handlers import NumpyHandler, blas_threads


class FakeBLAS:
    """Two BLAS copies' thread counts, as ``blas_threads.OpenBLAS`` holds
    them, with every count seen while a product ran."""

    def __init__(self, counts):
        self.counts = list(counts)
        self.sets = self.gets = 0

    def get(self):
        self.gets += 1
        return list(self.counts)

    def set(self, counts):
        self.sets += 1
        self.counts = list(counts)


@pytest.fixture
def fake(monkeypatch):
    lib = FakeBLAS([4, 2])
    monkeypatch.setattr(blas_threads, "_lib", lib)
    monkeypatch.setattr(blas_threads, "_found", True)
    monkeypatch.setattr(blas_threads, "_saved", None)
    monkeypatch.setattr(blas_threads, "_small", False)
    return lib


def test_small_products_run_on_one_thread_large_ones_as_blas_had_it(fake):
    seen = []
    small, large = blas_threads.SMALL_PRODUCT - 1, blas_threads.SMALL_PRODUCT
    assert blas_threads.product(lambda v: seen.append(fake.get()) or v, small, 7) == 7
    assert seen == [[1, 1]]
    blas_threads.product(lambda: seen.append(fake.get()), small)
    assert seen[-1] == [1, 1] and fake.sets == 1      # set once, not per product
    blas_threads.product(lambda: seen.append(fake.get()), large)
    assert seen[-1] == [4, 2] and fake.counts == [4, 2]
    blas_threads.product(lambda: None, small)
    blas_threads.restore()
    assert fake.counts == [4, 2]
    blas_threads.restore()                             # nothing to give back: no change
    assert fake.counts == [4, 2] and fake.sets == 4


def test_one_thread_already_is_left_alone(fake):
    fake.counts = [1, 1]
    for _ in range(5):
        blas_threads.product(lambda: None, 10)
    assert fake.gets == 1                  # asked once, not before every product
    blas_threads.restore()
    assert fake.sets == 0 and fake.counts == [1, 1]
    blas_threads.product(lambda: None, 10)  # small again after a restore: asked again
    assert fake.gets == 2 and fake.sets == 0


def test_products_from_several_threads_leave_the_counts_as_they_were(fake):
    def work():
        for macs in (10, blas_threads.SMALL_PRODUCT * 2, 10, 10):
            blas_threads.product(lambda: None, macs)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    blas_threads.restore()
    assert fake.counts == [4, 2]


def test_without_a_blas_to_steer_products_still_run(monkeypatch):
    monkeypatch.setattr(blas_threads, "_lib", None)
    monkeypatch.setattr(blas_threads, "_found", True)
    monkeypatch.setattr(blas_threads, "_saved", None)
    monkeypatch.setattr(blas_threads, "_small", False)
    assert blas_threads.product(np.add, 10, 2, 3) == 5


def test_the_handler_steers_the_real_blas():
    """On this machine's OpenBLAS (where there is one with several threads):
    the handler's small product leaves it on one thread and a large one
    gives the counts back; both products equal float64 NumPy's."""
    lib = blas_threads.find()
    if lib is None or max(lib.get()) <= 1:
        pytest.skip("no OpenBLAS with more than one thread to steer here")
    before = lib.get()
    rng = np.random.default_rng()
    h = NumpyHandler(np.float64)
    try:
        for n in (20, 400):                  # 8e3 and 6.4e7 multiply-adds
            a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
            out = h.zeros((n, n))
            h.dot_mm(h.create_from_numpy(a), h.create_from_numpy(b), out)
            np.testing.assert_allclose(h.get_numpy_copy(out), a @ b, rtol=1e-10, atol=1e-10)
            assert lib.get() == ([1] * len(before) if n == 20 else before)
    finally:
        blas_threads.restore()
    assert lib.get() == before
