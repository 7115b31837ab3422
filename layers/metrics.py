"""Metrics of network outputs: ``accuracy`` on the host, on outputs already
fetched, and ``DeviceAccuracy`` / ``device_accuracy``, the same count made
with handler ops (``argmax_t``, ``equal_tt``, ``sum_t``) on the device, so
that no output has to be downloaded.  Nothing here is on the training path.
"""
import numpy as np

from handlers import dtypes


def accuracy(outputs, targets):
    """Fraction of rows whose largest output is the target class.

    ``outputs`` (n, c) NumPy array; ``targets`` class indices of shape (n,) or
    (n, 1) (or any shape holding n of them, such as (B, T) for sequences), or
    one-hot rows (n, c).
    """
    outputs = np.asarray(outputs)
    targets = np.asarray(targets)
    if targets.shape == outputs.shape and outputs.shape[1] > 1:    # one-hot rows
        targets = targets.argmax(axis=1)
    targets = targets.reshape(-1).astype(np.int64)
    return float(np.mean(outputs.argmax(axis=1) == targets)) if len(targets) else float("nan")


class DeviceAccuracy:
    """Counts, on the device, the rows whose largest output is the target
    class: ``accuracy``'s numerator, without fetching the outputs.

    ``outputs`` is (n, c); ``targets`` class indices stored as whole numbers,
    (n, 1) or (n,), or one-hot rows (n, c) (c > 1), as ``accuracy`` takes
    them.  Ties and NaN as ``accuracy`` (the first largest, the first NaN).
    The scratch arrays are kept per shape, so counting batch after batch
    allocates nothing after the first call.  The count is an array of
    ``self.acc``: ``h`` itself, or for a half format its float32 twin
    (``h.twin``), where counts stay exact beyond the format's integers.

    Args:
        h: the handler of the arrays.
    """

    def __init__(self, h):
        self.h = h
        self.acc = h.twin(dtypes.compute_dtype(h.dtype))
        self._buffers = {}

    @staticmethod
    def supports(outputs, targets):
        """True if ``count`` takes arrays of these shapes."""
        if len(outputs.shape) != 2:
            return False
        n, c = outputs.shape
        shape = tuple(targets.shape)
        return shape in ((n,), (n, 1)) or (c > 1 and shape == (n, c))

    def count(self, outputs, targets, out=None):
        """The number of correct rows, in ``out`` (a one-element array of the
        handler, overwritten) or, if None, in an array of this object that
        the next call with the same shapes overwrites.  Returns that array;
        nothing waits for the device.  Raises ValueError for shapes that
        ``supports`` refuses."""
        h = self.h
        if not self.supports(outputs, targets):
            raise ValueError(f"DeviceAccuracy: outputs must be (n, c) and targets (n,), (n, 1) "
                             f"or (n, c); got outputs {tuple(outputs.shape)}, targets "
                             f"{tuple(targets.shape)}")
        n, c = outputs.shape
        key = (n, c, tuple(targets.shape))
        bufs = self._buffers.get(key)
        acc = self.acc
        if bufs is None:   # predicted class, target class, matches (and widened), count
            match = h.allocate((n, 1))
            bufs = self._buffers[key] = (h.allocate((n, 1)), h.allocate((n, 1)), match,
                                         match if acc is h else acc.allocate((n, 1)),
                                         acc.allocate((1,)))
        pred, label, match, wide, total = bufs
        h.argmax_t(outputs, 1, pred)
        if len(targets.shape) == 2 and targets.shape[1] == c and c > 1:
            h.argmax_t(targets, 1, label)    # one-hot rows
        elif len(targets.shape) == 2:
            label = targets                  # (n, 1) indices as they are
        else:
            label = h.reshape_t(targets, (n, 1))
        h.equal_tt(pred, label, match)
        if wide is not match:
            acc.cast_t(match, wide)          # 0 and 1: exact in any format
        out = total if out is None else out
        acc.sum_t(wide, None, out)
        return out


def device_accuracy(h, outputs, targets):
    """Fraction of rows whose largest output is the target class, computed
    with handler ops: a new one-element array of ``h``, or for a half format
    of its float32 twin (``DeviceAccuracy.acc``), which holds the fraction
    unrounded.  Fetch it with that handler's ``get_numpy_copy``; nothing
    waits for the device before.  Shapes as ``DeviceAccuracy``; NaN for 0
    rows, as ``accuracy``."""
    counter = DeviceAccuracy(h)
    acc = counter.acc
    result = acc.allocate((1,))
    if outputs.shape[0] == 0:
        acc.fill(result, float("nan"))
        return result
    acc.mult_st(1.0 / outputs.shape[0], counter.count(outputs, targets), result)
    return result
