"""Host-side metrics of fetched network outputs.

The handler contract has no argmax op, so a metric that needs one runs on the
host, on outputs the evaluation has already fetched.  This is bookkeeping on
results, not layer math: nothing here is on the training path.
"""
import numpy as np


def accuracy(outputs, targets):
    """Fraction of rows whose largest output is the target class.

    ``outputs`` (n, c) NumPy array; ``targets`` class indices of shape (n,) or
    (n, 1), or one-hot rows (n, c).
    """
    outputs = np.asarray(outputs)
    targets = np.asarray(targets)
    if targets.ndim == 2 and targets.shape[1] == outputs.shape[1] and outputs.shape[1] > 1:
        targets = targets.argmax(axis=1)
    targets = targets.reshape(-1).astype(np.int64)
    return float(np.mean(outputs.argmax(axis=1) == targets)) if len(targets) else float("nan")
