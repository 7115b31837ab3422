"""The table of page-locked host ranges behind ``PyCudaHandler.pin``
(pure Python, so it runs on the CPU too)."""
import mmap

import numpy as np

from handlers.cuda.transfer import PinnedRegistry

PAGE = mmap.PAGESIZE


def _pages(n):
    """A float64 array of n + 1 pages and the first page boundary in it."""
    raw = np.zeros((n + 1) * PAGE // 8)
    base = raw.__array_interface__["data"][0]
    return raw, base + (-base % PAGE)


def test_covered_contains_and_mixed():
    raw, p0 = _pages(6)
    reg = PinnedRegistry()
    reg.replace([], (p0 + PAGE, p0 + 3 * PAGE), raw)
    assert reg.covered(p0 + PAGE, p0 + 3 * PAGE)
    assert not reg.covered(p0, p0 + 2 * PAGE)
    first = (p0 - raw.__array_interface__["data"][0]) // 8
    inside = raw[first + PAGE // 8: first + PAGE // 8 + 10]
    across = raw[first + 3 * PAGE // 8 - 5: first + 3 * PAGE // 8 + 5]
    outside = raw[first + 4 * PAGE // 8: first + 4 * PAGE // 8 + 10]
    assert reg.contains(inside) and not reg.mixed(inside)
    assert not reg.contains(across) and reg.mixed(across)
    assert not reg.contains(outside) and not reg.mixed(outside)
    assert not PinnedRegistry().mixed(across)


def test_replace_merges_pieces_into_one():
    raw, p0 = _pages(8)
    reg = PinnedRegistry()
    reg.replace([], (p0, p0 + 2 * PAGE), raw)
    reg.replace([], (p0 + 4 * PAGE, p0 + 5 * PAGE), raw)
    old = [p for p in reg.ranges() if p[0] <= p0 + 4 * PAGE and p[1] >= p0 + PAGE]
    reg.replace(old, (p0, p0 + 5 * PAGE), raw)
    assert reg.ranges() == ((p0, p0 + 5 * PAGE),)
    assert reg.covered(p0, p0 + 5 * PAGE)
