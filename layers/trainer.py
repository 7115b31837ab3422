"""``Trainer``: epochs of mini-batch training, evaluation, the loss history.

Batches are cut from host (NumPy) arrays and reach the device through
``h.prefetch`` (double-buffered uploads that overlap compute).  The loss of
each step stays on the device, copied into a per-epoch log buffer.  Every
``log_every`` steps the progress bar starts an asynchronous copy of the log
(``get_numpy_copy_async`` into pinned memory) and shows the last one that has
finished, so it never stalls the device; only the end of an epoch waits.
"""
import math
import time
import warnings

import numpy as np

from handlers import CaptureError

from .params import view


def _progress_bar(total, enabled):
    """A tqdm bar, or None when disabled or tqdm is missing (imported lazily:
    tqdm is optional, the trainer works without it)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        warnings.warn("tqdm is not installed: training runs without a progress bar "
                      "(pip install tqdm)", stacklevel=3)
        return None
    return tqdm(total=total, unit="step", dynamic_ncols=True)


class History:
    """What ``Trainer.fit`` returns.

    Attributes:
        epochs: one dict per epoch: ``epoch``, ``train_loss`` (mean over the
            epoch's samples), ``seconds`` (training time of the epoch, device
            work included) and, with evaluation data, ``eval_loss`` and one
            entry per metric (``eval_accuracy``, ...).
        step_losses: the loss of every step, in order.
    """

    def __init__(self):
        self.epochs = []
        self.step_losses = []

    @property
    def train_loss(self):
        """Per-epoch mean training losses."""
        return [e["train_loss"] for e in self.epochs]

    def __repr__(self):
        return f"History({len(self.epochs)} epochs, {len(self.step_losses)} steps)"


class Trainer:
    """Mini-batch training of a ``Sequential`` with an optimizer.

    Args:
        net: a ``Sequential``.
        optimizer: e.g. ``SGD(net.parameters)``; ``step()`` after each backward.
        batch_size: samples per step (the last batch of an epoch may be smaller).
        batch_axis: the sample axis of the input arrays: 0 for (N, F) data,
            1 for time-major sequences (T, N, F).  Targets always have the
            sample axis first.
        seed: seed of the shuffling.
        log_every: read the running loss from the device every this many
            steps (progress bar); 0 reads it only at the end of an epoch.
        progress: show a tqdm progress bar (if tqdm is installed).
        metrics: {name: f(outputs, targets)} computed on the host from the
            evaluation outputs, e.g. {"accuracy": layers.metrics.accuracy}.
        graph: capture the training step once (after one eager warm-up step)
            and replay it for every full batch (``Handler.capture``); a
            smaller last batch runs eagerly.  None (default) captures where
            the handler says replays pay (``prefers_graphs``: PyCudaHandler).
            A step that cannot be captured (an op that waits for the device
            or allocates on every call) trains eagerly after a one-line
            warning saying why.  Captured and eager training give the same
            parameters, bit for bit.
    """

    def __init__(self, net, optimizer, batch_size=32, batch_axis=0, seed=0,
                 log_every=10, progress=True, metrics=None, graph=None):
        self.net, self.optimizer = net, optimizer
        self.h = net.h
        self.batch_size = int(batch_size)
        self.batch_axis = int(batch_axis)
        self.rng = np.random.default_rng(seed)
        self.log_every = int(log_every)
        self.progress = progress
        self.metrics = dict(metrics or {})
        self.graph = bool(getattr(self.h, "prefers_graphs", False) if graph is None else graph)
        self._step = _Step(net, optimizer, self.graph)

    # ----------------------------------------------------------------- batches
    def _take(self, x, idx):
        taken = np.take(x, idx, axis=self.batch_axis) if self.batch_axis else x[idx]
        return np.ascontiguousarray(taken)

    def batches(self, x, y, shuffle):
        """Host (x, y) batches of one pass over the data."""
        n = x.shape[self.batch_axis]
        order = self.rng.permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, self.batch_size):
            idx = order[start:start + self.batch_size]
            yield self._take(x, idx), np.ascontiguousarray(y[idx])

    def _batch_shapes(self, x, y):
        """The shapes of a full (x, y) batch."""
        xs = list(x.shape)
        xs[self.batch_axis] = self.batch_size
        return tuple(xs), (self.batch_size,) + tuple(y.shape[1:])

    def _check(self, x, y):
        n = x.shape[self.batch_axis]
        if len(y) != n:
            raise ValueError(f"Trainer: {n} inputs along axis {self.batch_axis} "
                             f"but {len(y)} targets")
        return n

    # ------------------------------------------------------------------- train
    def fit(self, x, y, epochs, eval_data=None, on_epoch=None):
        """Train for ``epochs`` passes over (x, y); returns a ``History``.

        ``eval_data`` (x, y) is evaluated after each epoch; ``on_epoch(record)``
        is called with each epoch's dict (e.g. to print it).
        """
        h = self.h
        n = self._check(x, y)
        steps = math.ceil(n / self.batch_size)
        sizes = np.array([min(self.batch_size, n - s * self.batch_size) for s in range(steps)])
        log = h.zeros((steps,))
        slots = [view(h, log, i, (1,)) for i in range(steps)]
        history = History()
        bar = _progress_bar(epochs * steps, self.progress)
        try:
            host_log = h.empty_pinned((steps,))          # target of async loss reads
            for epoch in range(1, epochs + 1):
                pending = None
                if bar is not None:
                    bar.set_description(f"epoch {epoch}/{epochs}")
                t0 = time.perf_counter()
                into = self._step.destinations(*self._batch_shapes(x, y))
                batches = h.prefetch(self.batches(x, y, True), _Step.DEPTH, into=into)
                for i, (xb, yb) in enumerate(batches):
                    self._step(xb, yb, slots[i])   # the loss stays on the device
                    if bar is not None:
                        bar.update(1)
                        if self.log_every and (i + 1) % self.log_every == 0:
                            # Read the running loss without stalling the device:
                            # show the last finished copy, then start the next.
                            if pending is not None and pending[0].done():
                                seen = host_log[:pending[1]]
                                bar.set_postfix(
                                    loss=f"{np.average(seen, weights=sizes[:pending[1]]):.4f}")
                                pending = None
                            if pending is None:
                                pending = (h.get_numpy_copy_async(log, out=host_log), i + 1)
                if pending is not None:
                    pending[0].result()           # host_log is reused next epoch
                losses = h.get_numpy_copy(log)     # waits for the epoch's device work
                seconds = time.perf_counter() - t0
                record = {"epoch": epoch,
                          "train_loss": float(np.average(losses, weights=sizes)),
                          "seconds": seconds}
                history.step_losses.extend(float(v) for v in losses)
                if eval_data is not None:
                    record.update({f"eval_{k}": v for k, v in self.evaluate(*eval_data).items()})
                history.epochs.append(record)
                if bar is not None:
                    bar.set_postfix(loss=f"{record['train_loss']:.4f}")
                if on_epoch is not None:
                    on_epoch(record)
        finally:
            if bar is not None:
                bar.close()
        return history

    # ---------------------------------------------------------------- evaluate
    def evaluate(self, x, y):
        """Mean loss and the metrics over (x, y), in inference mode.

        Returns {"loss": float, <metric name>: float, ...}.
        """
        h, net = self.h, self.net
        n = self._check(x, y)
        total = h.zeros((1,))
        outputs = []
        for xb, yb in h.prefetch(self.batches(x, y, False)):
            loss, out = net.evaluate_batch(xb, yb)
            nb = yb.shape[0]
            h.axpby(float(nb), loss, 1.0, total)   # sum of per-sample losses, on the device
            if self.metrics:
                outputs.append(h.get_numpy_copy(out))
        result = {"loss": float(h.get_numpy_copy(total)[0]) / n}
        if self.metrics:
            outputs = np.concatenate(outputs)
            for name, fn in self.metrics.items():
                result[name] = fn(outputs, y)
        return result


class _Step:
    """One training step on a batch, eager or replayed from a capture.

    With ``graph`` on, full batches arrive in arrays of the step's own:
    :meth:`destinations` gives ``prefetch`` one (x, y) pair per batch in
    flight, and each pair gets its own graph, captured on first use (after
    one eager warm-up step, which allocates every buffer the layers need), so
    a replay reads its batch where the upload put it, with no device copy.
    Other batches (a smaller last one) run eagerly.
    """

    #: prefetch's depth, and so the number of (x, y) pairs and graphs
    DEPTH = 2

    def __init__(self, net, optimizer, graph):
        self.net, self.optimizer, self.h = net, optimizer, net.h
        self.graph = graph
        self._sets = []             # [x, y, loss, Graph or None] per destination
        self._warm = False

    @property
    def captured(self):
        """The graphs captured so far."""
        return [s[3] for s in self._sets if s[3] is not None]

    def destinations(self, x_shape, y_shape):
        """``into`` for ``prefetch`` of batches of these shapes (None with
        graphs off); the arrays and graphs are kept while the shapes hold."""
        if not self.graph:
            return None
        if not self._sets or self._sets[0][0].shape != x_shape \
                or self._sets[0][1].shape != y_shape:
            h = self.h
            self._sets = [[h.allocate(x_shape), h.allocate(y_shape), h.zeros((1,)), None]
                          for _ in range(self.DEPTH)]
        return [(s[0], s[1]) for s in self._sets]

    def _eager(self, xb, yb, out):
        loss = self.net.train_step(xb, yb)
        self.optimizer.step()
        self.h.copy_to(loss, out)

    def __call__(self, xb, yb, out):
        """Train on (xb, yb) and copy the step's loss into ``out``."""
        s = next((s for s in self._sets if s[0] is xb and s[1] is yb), None) \
            if self.graph else None
        if s is None:
            self._eager(xb, yb, out)
            return
        if not self._warm:
            self._warm = True
            self._eager(xb, yb, out)
            return
        if s[3] is None:
            try:
                s[3] = self.h.capture(lambda: self._eager(xb, yb, s[2]))
            except CaptureError as e:
                warnings.warn(f"Trainer: training eagerly, the step cannot be "
                              f"captured: {e}", stacklevel=3)
                self.graph = False
                self._eager(xb, yb, out)
                return
        s[3].replay()
        self.h.copy_to(s[2], out)
