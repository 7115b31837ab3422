"""``Trainer``: epochs of mini-batch training, evaluation, the loss history.

Batches are cut from host (NumPy) arrays and reach the device through
``h.prefetch`` (double-buffered uploads that overlap compute): inputs in the
network's input format (``net.input_h``), targets in its loss's
(``net.target_h``, float32 for a network computing in a half format, so that
class labels stay exact).  The loss of each step stays on the device, copied
into a per-epoch log buffer.  Every ``log_every`` steps the progress bar
starts an asynchronous copy of the log (``get_numpy_copy_async`` into pinned
memory) and shows the last one that has finished, so it never stalls the
device; only the end of an epoch waits.

Every input is checked before the first step, so a bad call raises (and
leaves the parameters untouched) instead of training on garbage.  A loss that
becomes NaN or infinite stops training with a ``NonFiniteLossError`` naming
the epoch and step; the check reads one device flag every ``check_every``
steps (not every step, which would wait for the device each time) and at the
end of each epoch.  ``on_nonfinite="skip"`` skips such steps instead.

A run is saved whole (``Trainer.save``: parameters, optimizer state, loss
scaler, position and every random generator) and resumed by ``load`` and
``fit``, bit for bit; ``fit``'s ``epochs`` counts over the run.
"""
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping

import numpy as np

from handlers import CaptureError, dtypes

from . import checkpoint, interrupts
from .data_parallel import data_parallel_for
from .losses import SoftmaxCrossEntropy, SquaredError
from .metrics import DeviceAccuracy, accuracy
from .params import view
from .schedules import check_max_norm, clip_grad_norm


class NonFiniteLossError(FloatingPointError):
    """Training stopped: the loss (or the parameters) became NaN or infinite.

    Attributes:
        epoch: the epoch (1-based) in which it was found.
        step: the first step of that epoch (1-based) whose loss is not
            finite, or None when the loss stayed finite but the parameters
            did not.
        steps: (first, last): the steps of the epoch the failed check covered;
            all of them ran, so the parameters may be non-finite now.
    """

    def __init__(self, message, epoch, step, steps):
        super().__init__(message)
        self.epoch, self.step, self.steps = epoch, step, steps


def _check_metrics(metrics):
    """``metrics`` (None or a mapping {name: f(outputs, targets)}) as a dict;
    TypeError saying what it must be otherwise (a str such as "accuracy",
    a list, a bare function, a name that is not a str, a value that cannot
    be called)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"Trainer: metrics must be a mapping {{name: f(outputs, targets)}}, "
                        f"e.g. {{'accuracy': layers.metrics.accuracy}}, or None; got "
                        f"{type(metrics).__name__} {metrics!r}")
    for name, fn in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"Trainer: metrics names must be str, got {type(name).__name__} "
                            f"{name!r}")
        if not callable(fn):
            raise TypeError(f"Trainer: metrics[{name!r}] must be callable as f(outputs, "
                            f"targets), got {type(fn).__name__} {fn!r}")
    return dict(metrics)


def _check_int(name, value, minimum):
    """``value`` as an int >= ``minimum``; TypeError for a non-int (bool
    included: ``True`` is not a batch size), ValueError below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Trainer: {name} must be an int, got {type(value).__name__} "
                        f"{value!r}")
    if value < minimum:
        raise ValueError(f"Trainer: {name} must be >= {minimum}, got {value}")
    return int(value)


def _check_array(where, name, a):
    """TypeError unless ``a`` is a real-valued numpy.ndarray."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{where}: {name} must be a numpy.ndarray, got {type(a).__name__}; "
                        f"convert it with np.asarray({name})")
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{where}: {name} must hold real numbers (int or float), "
                        f"got dtype {a.dtype}")


def _check_finite(where, name, a):
    """ValueError naming the first NaN or infinite element of ``a``."""
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))
        raise ValueError(f"{where}: {name} holds {len(bad)} non-finite value(s), the first "
                         f"{a[tuple(bad[0])]} at index {tuple(int(i) for i in bad[0])}")


def _class_labels(where, y, c, dtype):
    """Class indices (n,) or (n, 1), ints or integer-valued floats, checked
    to lie in [0, c); returned as (n, 1) floats (the losses' label format).
    ValueError where indices 0 .. c-1 are not all exact in ``dtype``, the
    format the loss takes them in (float32: up to 2^24)."""
    limit = dtypes.exact_integers(dtype)
    if c - 1 > limit:
        raise ValueError(f"{where}: the network has {c} classes, but its loss takes class "
                         f"labels in {dtype}, which holds whole numbers exactly only up to "
                         f"{limit}: some labels would name other classes")
    labels = y.reshape(-1)
    if y.dtype.kind == "f" and np.any(labels != np.floor(labels)):
        i = int(np.flatnonzero(labels != np.floor(labels))[0])
        raise ValueError(f"{where}: y holds class indices, which must be whole numbers; "
                         f"y[{i}] is {labels[i]}")
    out = (labels < 0) | (labels >= c)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise ValueError(f"{where}: class labels must be in [0, {c}) for a network with "
                         f"{c} outputs; {int(out.sum())} are not, the first y[{i}] = "
                         f"{labels[i]}")
    return labels.astype(np.float64).reshape(-1, 1)


def _in_step(xs, ys):
    """(x, y) pairs of two prefetches of one pass; both are closed (their
    threads joined) when the iteration ends or is left."""
    try:
        yield from zip(xs, ys)
    finally:
        xs.close()
        ys.close()


def _check_progress(progress):
    """``progress`` (None, or a bool: see ``Trainer``) as None, True or
    False; TypeError for anything else (a str such as "auto" or "off")."""
    if progress is None:
        return None
    if isinstance(progress, (bool, np.bool_)) or (isinstance(progress, (int, np.integer))
                                                  and progress in (0, 1)):
        return bool(progress)
    raise TypeError(f"Trainer: progress must be None (a bar on a terminal only), True or "
                    f"False, got {type(progress).__name__} {progress!r}")


def _is_terminal(stream):
    """Whether ``stream`` is a terminal; False for None (no console, as under
    pythonw), a closed stream or an object without ``isatty``."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _progress_bar(total, enabled):
    """A tqdm bar on ``sys.stderr``, or None.  ``enabled``: True shows it,
    False not, None only where ``sys.stderr`` is a terminal (a bar redrawn
    in a log file or a pipe leaves a line per update).  tqdm is optional
    and imported lazily, only for a bar to draw; without it, a warning."""
    # sys.stderr looked up now, not at import: a redirection since then counts
    stream = sys.stderr
    if enabled is False or (enabled is None and not _is_terminal(stream)):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        warnings.warn("tqdm is not installed: training runs without a progress bar "
                      "(pip install tqdm, or pass progress=False)", stacklevel=3)
        return None
    return tqdm(total=total, unit="step", dynamic_ncols=True, file=stream)


class History:
    """What ``Trainer.fit`` returns.

    Attributes:
        epochs: one dict per epoch: ``epoch``, ``train_loss`` (mean over the
            epoch's samples), ``seconds`` (training time of the epoch, device
            work included), with evaluation data ``eval_loss`` and one
            entry per metric (``eval_accuracy``, ...), and in float16 mixed
            precision ``loss_scale`` (at the epoch's end) and
            ``overflow_skipped`` (its steps skipped by the loss scaling).
        step_losses: the loss of every step, in order (skipped steps
            included, with their non-finite loss).
        skipped_steps: (epoch, step) of every step skipped for a non-finite
            loss or gradient (``on_nonfinite="skip"``), 1-based.
    """

    def __init__(self):
        self.epochs = []
        self.step_losses = []
        self.skipped_steps = []

    @property
    def train_loss(self):
        """Per-epoch mean training losses."""
        return [e["train_loss"] for e in self.epochs]

    def __repr__(self):
        return f"History({len(self.epochs)} epochs, {len(self.step_losses)} steps)"


class Trainer(checkpoint.NoCopies):
    """Mini-batch training of a ``Sequential`` with an optimizer.

    Args:
        net: a ``Sequential``.
        optimizer: e.g. ``SGD(net.parameters)``; ``step()`` after each backward.
        batch_size: samples per step, a positive int (the last batch of an
            epoch may be smaller).
        batch_axis: the sample axis of the input arrays: 0 for (N, F) data,
            1 for time-major sequences (T, N, F).  Targets always have the
            sample axis first.
        seed: seed of the shuffling.
        log_every: read the running loss from the device every this many
            steps (progress bar); 0 reads it only at the end of an epoch.
        progress: the tqdm progress bar of ``fit`` (if tqdm is installed),
            written to ``sys.stderr``.  None (default): shown only where
            ``sys.stderr`` is a terminal, so that a run whose output goes to
            a log file, a pipe or a CI job does not fill it with redrawn
            bars (a Jupyter notebook is not a terminal either: pass True
            there).  True shows it wherever the output goes, False never.
            Under data parallelism only rank 0 shows one.  Anything but
            None, a bool, 0 or 1 raises TypeError.
        metrics: {name: f(outputs, targets)} computed on the host from the
            evaluation outputs, e.g. {"accuracy": layers.metrics.accuracy};
            ``evaluate`` returns each under its name, beside the loss, and
            ``fit`` records it as ``eval_<name>`` after each epoch of
            ``eval_data``.  ``f`` gets all the outputs as one NumPy array
            and the targets as checked (class labels given as (n,) or
            (n, 1) arrive as (n, 1) floats).
            ``layers.metrics.accuracy`` itself is counted on the device
            instead (``DeviceAccuracy``, the same value), so evaluation
            downloads no outputs for it.  Anything but None or such a
            mapping (names str, values callable) raises TypeError.
        graph: capture the training step once (after one eager warm-up step)
            and replay it for every full batch (``Handler.capture``); a
            smaller last batch runs eagerly.  None (default) captures where
            the handler says replays pay (``prefers_graphs``: PyCudaHandler)
            and ``on_nonfinite`` is "raise".
            A step that cannot be captured (an op that waits for the device
            or allocates on every call) trains eagerly after a one-line
            warning saying why.  Captured and eager training give the same
            parameters, bit for bit.
        check_every: check the losses of the last this many steps, and the
            parameters, for NaN and infinity (``is_fully_finite``, which
            waits for the device) every this many steps, and at the end of
            each epoch.  A larger value syncs less often but lets more steps
            run after the loss went bad.
        on_nonfinite: "raise" (default): a non-finite loss or parameter
            stops training with a ``NonFiniteLossError`` (a
            ``FloatingPointError``) that names the epoch and the first bad
            step; the steps up to the check have run, so the parameters are
            left as they were then (likely non-finite).  "skip": a step whose
            loss or gradients are not finite does not update the parameters
            (nor the optimizer's state) and is listed in
            ``History.skipped_steps``; this reads two flags from the device
            on every step (a host sync per step) and so cannot be captured
            (``graph=True`` raises ValueError).  Non-finite parameters (an
            update that overflows, say) still raise.
        precision: None (default) trains in the network's format; "bf16"
            (or "bfloat16") trains in mixed precision: the network computes
            in bfloat16 on ``h.twin("bfloat16")`` while its parameters stay
            the master copy in their own format (float32, say), which the
            optimizer updates (``Sequential.mixed_precision``).  The loss
            computes in float32, and targets, class labels above all, are
            uploaded in float32 (a bfloat16 label past 256 would name
            another class), as are an ``Embedding``'s ids.  A captured
            step records the work of both formats (twins share a capture).
            With ``SGD`` in one process and no skip check, the update reads
            the bfloat16 gradients directly (``SGD.step(grads=...)``), with
            no cast into ``net.grads``, which these steps leave unwritten.
            "fp16" (or "float16") likewise in float16, with dynamic loss
            scaling decided on the device (``net.loss_scaler``, a
            ``LossScaler``): a step whose gradients overflow is skipped
            without a host read, and each epoch's record gives the
            ``loss_scale`` and the steps ``overflow_skipped``.
        schedule: None, or a callable giving the learning rate of each step
            from the run's step count (0 first, counted over epochs, as
            ``layers.schedules.WarmupCosine`` does): set on the optimizer
            (a device scalar) before each step, captured ones included.
        clip_norm: None, or the global gradient norm each step's gradients
            are scaled down to when above it (``clip_grad_norm``: on the
            device, inside a captured step), before the update.
        data_parallel: True trains one replica per process of an MPI job
            (``mpirun -n N``; a process started without it is a group of
            one, which trains as without this switch), every rank taking
            its shard of each batch of ``batch_size`` (the global batch)
            and the gradients summed over the ranks in buckets while
            backward runs (``layers.data_parallel``); every rank passes the
            whole data set to ``fit``.  Or a ``DataParallel`` of ``net``,
            for its options.  Evaluation is not sharded: every rank
            evaluates the whole set and gets the same result.

    ``fit`` and ``evaluate`` check their data before any step (TypeError or
    ValueError naming the argument): x and y must be ``numpy.ndarray`` arrays of
    real numbers (a list is refused rather than converted: say
    ``np.asarray(x)``), non-empty, finite, with as many samples along
    ``batch_axis`` as y has rows, and y must fit the network's output and
    loss.  For ``SoftmaxCrossEntropy`` y is integer class labels (n,),
    class indices (n, 1) (ints or whole floats) in [0, c) for c outputs, or
    a distribution per row (n, c), or for a network that gives T output rows
    a sample (a GPT's (B * T, vocab) logits) class indices (n, T); labels
    are converted once, on the host, to the floats the loss takes, and
    uploaded in the loss's format
    (``net.target_h``: float32 under mixed precision, where they are exact
    up to 2^24; more classes than that raise ValueError).  For
    ``SquaredError`` y has the shape of the network's output.  The output
    shape comes from one inference forward pass of the first batch (no
    parameter changes), which also checks that x fits the first layer.

    A run has a position, ``epoch`` (epochs completed) and ``step`` (steps
    of the next epoch completed, nonzero only in a run saved inside an
    epoch and loaded); ``fit(x, y, epochs)`` trains until ``epoch`` reaches
    ``epochs``.  ``state_dict`` / ``load_state_dict`` and ``save`` /
    ``load`` carry the whole run (see ``layers.checkpoint``).
    """

    def __init__(self, net, optimizer, batch_size=32, batch_axis=0, seed=0,
                 log_every=10, progress=None, metrics=None, graph=None,
                 check_every=50, on_nonfinite="raise", precision=None, data_parallel=False,
                 schedule=None, clip_norm=None):
        self.net, self.optimizer = net, optimizer
        if schedule is not None and not callable(schedule):
            raise TypeError(f"Trainer: schedule must be a callable of the step count, "
                            f"got {schedule!r}")
        if clip_norm is not None:
            check_max_norm("Trainer", "clip_norm", clip_norm)
        #: the learning rate per step of the run (a callable), or None
        self.schedule = schedule
        self._mixed_precision(precision)
        self.h = net.h
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.batch_axis = _check_int("batch_axis", batch_axis, 0)
        self.rng = np.random.default_rng(seed)
        #: epochs of the run completed (``fit``'s ``epochs`` is the number to reach)
        self.epoch = 0
        #: steps of epoch ``epoch + 1`` completed (0 between epochs): a run
        #: stopped inside an epoch and reloaded resumes at the next step
        self.step = 0
        # the shuffling generator's state when the epoch in progress drew
        # its order, and what that epoch recorded so far: a save inside an
        # epoch keeps them, so a resume draws the same order and ends it
        # with the same record
        self._epoch_start = None
        self._partial = None          # (losses, skipped steps, samples) of a loaded run
        self._epoch_log = None        # (device log, skipped list, samples) while fit runs
        self.log_every = _check_int("log_every", log_every, 0)
        self.check_every = _check_int("check_every", check_every, 1)
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"Trainer: on_nonfinite must be 'raise' or 'skip', "
                             f"got {on_nonfinite!r}")
        self.skip_nonfinite = on_nonfinite == "skip"
        if self.skip_nonfinite and graph:
            raise ValueError("Trainer: on_nonfinite='skip' reads the loss on the host every "
                             "step, which a captured graph cannot do: pass graph=False or None")
        #: the ``progress`` setting: None (a bar on a terminal only), True or False
        self.progress = _check_progress(progress)
        self.metrics = _check_metrics(metrics)
        if graph is None:
            graph = getattr(self.h, "prefers_graphs", False) and not self.skip_nonfinite
        self.graph = bool(graph)
        # A collective: every rank builds its trainer at the same point.
        self._dp = data_parallel_for(self, data_parallel)
        self._step = _Step(net if self._dp is None else self._dp, optimizer, self.graph,
                           self.skip_nonfinite,
                           half_grads(net, optimizer, self._dp is not None, self.skip_nonfinite),
                           clip_norm)

    def _mixed_precision(self, precision):
        """Apply ``precision`` (see the class docstring) to the network."""
        if precision is None:
            return
        if precision not in ("bf16", "bfloat16", "fp16", "float16"):
            raise ValueError(f"Trainer: precision must be None, 'bf16' or 'fp16', "
                             f"got {precision!r}")
        dt = dtypes.resolve(precision)
        if self.net.compute is None:
            self.net.mixed_precision(dt)
        elif self.net.h.dtype != dt:
            raise ValueError(f"Trainer: the network already computes in {self.net.h.dtype}, "
                             f"not {dt}")

    # ----------------------------------------------------------------- batches
    def _take(self, x, idx):
        taken = np.take(x, idx, axis=self.batch_axis) if self.batch_axis else x[idx]
        return np.ascontiguousarray(taken)

    def _batch_indices(self, n, shuffle, shard, first=0):
        """The sample indices of each batch of one pass over n samples, from
        batch number ``first`` on (a resumed epoch: the order is drawn whole,
        as the interrupted pass drew it).  The order is drawn now, in the
        caller's thread, not when a prefetch thread first asks."""
        order = self.rng.permutation(n) if shuffle else np.arange(n)
        dp = self._dp if shard else None

        def each():
            for start in range(first * self.batch_size, n, self.batch_size):
                idx = order[start:start + self.batch_size]
                yield idx if dp is None else dp.shard(idx)
        return each()

    def batches(self, x, y, shuffle, shard=False, first=0):
        """Host (x, y) batches of one pass over the data, from batch number
        ``first`` on; with ``shard``, under data parallelism, this rank's
        part of each batch."""
        order = self._batch_indices(x.shape[self.batch_axis], shuffle, shard, first)
        return ((self._take(x, idx), np.ascontiguousarray(y[idx])) for idx in order)

    def _uploads(self, x, y, shuffle, shard=False, into=None, first=0):
        """Device (x, y) batches of one pass (``prefetch``), from batch
        number ``first`` on: x in the network's input format, y in its
        loss's.  Where the two differ (mixed precision, a half network) they
        are two prefetches in step, each with its own destinations of
        ``into``."""
        hx, hy = self.net.input_h, self.net.target_h
        if hx is hy:
            return hx.prefetch(self.batches(x, y, shuffle, shard, first), _Step.DEPTH,
                               into=into)
        order = list(self._batch_indices(x.shape[self.batch_axis], shuffle, shard, first))
        xs = hx.prefetch((self._take(x, idx) for idx in order), _Step.DEPTH,
                         into=None if into is None else [d[0] for d in into])
        ys = hy.prefetch((np.ascontiguousarray(y[idx]) for idx in order), _Step.DEPTH,
                         into=None if into is None else [d[1] for d in into])
        return _in_step(xs, ys)

    def _batch_shapes(self, x, y):
        """The shapes of a full (x, y) batch (this rank's shard of one, data parallel)."""
        xs = list(x.shape)
        b = self.batch_size if self._dp is None else self._dp.shard_size(self.batch_size)
        xs[self.batch_axis] = b
        return tuple(xs), (b,) + tuple(y.shape[1:])

    # ------------------------------------------------------------------ checks
    def _prepare(self, where, x, y):
        """Check (x, y) and return them, with class labels as (n, 1) floats."""
        _check_array(where, "x", x)
        _check_array(where, "y", y)
        if x.ndim <= self.batch_axis:
            raise ValueError(f"{where}: x has {x.ndim} axes, so it has no batch_axis "
                             f"{self.batch_axis}")
        n = x.shape[self.batch_axis]
        if n == 0 or x.size == 0:
            raise ValueError(f"{where}: x is empty (shape {x.shape})")
        if y.ndim == 0 or y.shape[0] != n:
            raise ValueError(f"{where}: x has {n} samples along axis {self.batch_axis} but "
                             f"y has {y.shape[0] if y.ndim else 0} (shape {y.shape})")
        _check_finite(where, "x", x)
        _check_finite(where, "y", y)
        return x, self._check_targets(where, y, self._output_shape(where, x))

    def _output_shape(self, where, x):
        """The network's output shape for the first batch of x: one inference
        forward pass, which also rejects an x the first layer cannot take."""
        first = self._take(x, np.arange(min(self.batch_size, x.shape[self.batch_axis])))
        try:
            return tuple(self.net.forward(self.net.input_h.create_from_numpy(first)).shape)
        except ValueError as e:
            raise ValueError(f"{where}: x of shape {x.shape} does not fit the network: "
                             f"{e}") from e

    def _check_targets(self, where, y, out):
        """y checked against the loss and the output shape ``out``."""
        loss, b = self.net.loss, out[0]
        if isinstance(loss, SoftmaxCrossEntropy) and len(out) == 2:
            c = out[1]
            if y.ndim == 1 or (y.shape[1:] == (1,) and c != 1):
                return _class_labels(where, y, c, self.net.target_h.dtype)
            first = min(self.batch_size, y.shape[0])      # the batch behind ``out``
            per = out[0] // first if out[0] % first == 0 else 0   # output rows a sample
            if per > 1 and y.shape[1:] == (per,):         # sequences: (n, T) indices
                return _class_labels(where, y, c, self.net.target_h.dtype).reshape(y.shape)
            if y.shape[1:] == (c,):
                return y
            raise ValueError(f"{where}: y must be class labels (n,) or (n, 1), "
                             f"distributions (n, {c}) for a network with {c} outputs, or "
                             f"(n, T) labels for one that gives T rows a sample; got shape "
                             f"{y.shape}")
        if isinstance(loss, SquaredError) and y.shape[1:] != out[1:]:
            raise ValueError(f"{where}: y must have the network output's shape "
                             f"(n,) + {out[1:]} (a batch of {b} gives {out}); got shape "
                             f"{y.shape}")
        return y      # another loss checks its own targets

    # ------------------------------------------------------------------- train
    def fit(self, x, y, epochs, eval_data=None, on_epoch=None, checkpoint=None,
            checkpoint_every=1):
        """Train until the run has done ``epochs`` epochs; returns the
        ``History`` of the epochs this call ran.

        ``epochs`` is the number of epochs to reach, counted over the run
        (``self.epoch`` of them are done): a new trainer runs ``epochs``
        passes over (x, y); one restored by ``load`` runs those that remain,
        starting inside the epoch where the saved run stopped, at its next
        step.  A call with nothing left to run warns and returns an empty
        history (for more, pass a larger ``epochs``).

        ``eval_data`` (x, y) is evaluated after each epoch; ``on_epoch(record)``
        is called with each epoch's dict (e.g. to print it).  Everything is
        checked before the first step (see the class docstring); a loss that
        becomes non-finite raises ``NonFiniteLossError`` (or skips the step,
        with ``on_nonfinite="skip"``).  Ctrl-C (``KeyboardInterrupt``) stops
        it between two steps, never inside one, so the parameters and the
        optimizer's state are those of the last whole step.

        ``checkpoint``: a path; the run is saved there (``save``) after every
        ``checkpoint_every`` epochs and after the last, and on Ctrl-C once the
        step in flight has completed, before the ``KeyboardInterrupt`` goes
        on (except under data parallelism with several processes, where the
        ranks may stand at different steps: there the last epoch's
        checkpoint stands).  The epoch's save comes after ``on_epoch``, so
        that what the callback changed (a learning rate, say) is saved with
        the epoch it follows.
        """
        checkpoint_every = _check_int("checkpoint_every", checkpoint_every, 1)
        if checkpoint is not None:
            checkpoint = os.fspath(checkpoint)
            folder = os.path.dirname(os.path.abspath(checkpoint))
            if not os.path.isdir(folder):
                raise ValueError(f"Trainer.fit: checkpoint {checkpoint!r}: the folder "
                                 f"{folder} does not exist")
        with interrupts.deferred() as held:
            try:
                return self._fit(x, y, epochs, eval_data, on_epoch, held, checkpoint,
                                 checkpoint_every)
            except KeyboardInterrupt:
                # raised only between two steps (interrupts.deferred): the
                # state is that of the last whole step
                if checkpoint is not None and (self._dp is None or self._dp.size == 1):
                    self.save(checkpoint)
                raise
            finally:
                self._leave_epoch()

    def _fit(self, x, y, epochs, eval_data, on_epoch, held, path, every):
        epochs = _check_int("epochs", epochs, 0)
        x, y = self._prepare("Trainer.fit", x, y)
        if eval_data is not None:
            if not isinstance(eval_data, (tuple, list)) or len(eval_data) != 2:
                raise TypeError("Trainer.fit: eval_data must be a pair (x, y), got "
                                f"{type(eval_data).__name__}")
            eval_data = self._prepare("Trainer.fit eval_data", *eval_data)
        h = self.h
        n = x.shape[self.batch_axis]
        steps = math.ceil(n / self.batch_size)
        first = self._resume_point(n, steps)
        history = History()
        if epochs <= self.epoch:
            if epochs > 0:
                warnings.warn(f"Trainer.fit: this run has done {self.epoch} epochs, and epochs="
                              f"{epochs} is the number to reach, so there is nothing to run; "
                              f"pass epochs={self.epoch + epochs} for {epochs} more",
                              stacklevel=3)
            return history
        sizes = np.array([min(self.batch_size, n - s * self.batch_size) for s in range(steps)])
        log = h.zeros((steps,))
        slots = [view(h, log, i, (1,)) for i in range(steps)]
        scaler = self.net.loss_scaler     # float16 mixed precision, else None
        overflow_seen = 0 if scaler is None else scaler.skipped
        if self._dp is not None:
            self._dp.check_epoch(sizes)
        # rank 0 alone draws a bar (data_parallel_for turns a True off on the
        # others; a None, decided per rank's stream, is turned off here)
        show = self.progress if self._dp is None or self._dp.rank == 0 else False
        bar = _progress_bar((epochs - self.epoch) * steps - first, show)
        try:
            host_log = h.empty_pinned((steps,))          # target of async loss reads
            for epoch in range(self.epoch + 1, epochs + 1):
                if self._step.half_grads is not None:
                    # the steps' forward passes skip the working copy's cast
                    # (their updates write it): a load, an on_epoch callback
                    # or the user may have changed the master parameters
                    self.net.refresh_working()
                pending, checked, skipped = None, first, []
                if first:   # a resumed epoch: what its first steps recorded
                    losses, skipped, _ = self._partial
                    h.set_from_numpy(view(h, log, 0, (first,)), losses)
                    self._partial = None
                self._epoch_log = (log, skipped, n)
                if bar is not None:
                    bar.set_description(f"epoch {epoch}/{epochs}")
                t0 = time.perf_counter()
                into = self._step.destinations(*self._batch_shapes(x, y), self.net.input_h,
                                               self.net.target_h)
                # where this epoch's order is drawn from, for a save inside it
                self._epoch_start = self.rng.bit_generator.state
                batches = self._uploads(x, y, True, shard=True, into=into, first=first)
                for i, (xb, yb) in enumerate(batches, first):
                    if self._dp is not None:
                        self._dp.set_batch(sizes[i])
                    if self.schedule is not None:
                        self.optimizer.lr = self.schedule((epoch - 1) * steps + i)
                    if not self._step(xb, yb, slots[i]):   # the loss stays on the device
                        skipped.append(i)
                    self.step = i + 1
                    if held is not None:
                        held.take()            # a Ctrl-C, now that the step is whole
                    if self._dp is not None:
                        self._dp.step_issued()
                    if (i + 1) % self.check_every == 0:
                        self._check_nonfinite(log, checked, i + 1, epoch, skipped)
                        checked = i + 1
                    if bar is not None:
                        bar.update(1)
                        if self.log_every and (i + 1) % self.log_every == 0:
                            # Read the running loss without stalling the device:
                            # show the last finished copy, then start the next.
                            if pending is not None and pending[0].done():
                                seen = host_log[:pending[1]].astype(np.float64)
                                bar.set_postfix(
                                    loss=f"{np.average(seen, weights=sizes[:pending[1]]):.4f}")
                                pending = None
                            if pending is None:
                                pending = (h.get_numpy_copy_async(log, out=host_log), i + 1)
                first = 0
                if pending is not None:
                    pending[0].result()           # host_log is reused next epoch
                if checked < steps:
                    self._check_nonfinite(log, checked, steps, epoch, skipped)
                # waits for the epoch's device work; float64 from any format
                losses = h.get_numpy_copy(log).astype(np.float64)
                seconds = time.perf_counter() - t0
                self.epoch, self.step, self._epoch_log = epoch, 0, None
                record = {"epoch": epoch,
                          "train_loss": self._epoch_loss(losses, sizes, skipped),
                          "seconds": seconds}
                if scaler is not None:   # float16: the device's own count of skips
                    record["loss_scale"], total = scaler.read()
                    record["overflow_skipped"], overflow_seen = total - overflow_seen, total
                history.step_losses.extend(float(v) for v in losses)
                history.skipped_steps.extend((epoch, i + 1) for i in skipped)
                if eval_data is not None:
                    record.update({f"eval_{k}": v for k, v in self._evaluate(*eval_data).items()})
                history.epochs.append(record)
                if bar is not None:
                    bar.set_postfix(loss=f"{record['train_loss']:.4f}")
                if on_epoch is not None:
                    on_epoch(record)
                if path is not None and (epoch % every == 0 or epoch == epochs):
                    self.save(path)
                if held is not None:
                    held.take()
        finally:
            if bar is not None:
                bar.close()
        return history

    def _leave_epoch(self):
        """``fit`` is left inside an epoch (an exception, Ctrl-C): keep what
        the epoch recorded, so that the trainer can be saved or ``fit`` go
        on from the next step."""
        if self._epoch_log is not None and self.step:
            try:
                self._partial = self._epoch_so_far()
            except Exception:  # noqa: BLE001 - a failed device: the losses are lost
                _, skipped, samples = self._epoch_log
                self._partial = (np.full(self.step, np.nan), list(skipped), samples)
        self._epoch_log = None

    def _epoch_so_far(self):
        """(losses, skipped steps, samples) of the steps of the epoch in
        progress done so far: from the device log while ``fit`` runs, else
        what a load (or a ``fit`` left inside an epoch) kept."""
        if self._epoch_log is None:
            return self._partial
        log, skipped, samples = self._epoch_log
        return (self.h.get_numpy_copy(log)[:self.step].astype(np.float64), list(skipped),
                samples)

    def _resume_point(self, n, steps):
        """The step at which the epoch in progress resumes (0 unless a run
        saved inside an epoch was loaded); ValueError where the data or the
        batch size differ from the saved run's, which would change its
        batches."""
        if self.step == 0:
            return 0
        losses, skipped, samples = self._partial
        # the epoch draws its order again from where it drew it first
        self.rng.bit_generator.state = self._epoch_start
        if samples != n or self.step >= steps:
            raise ValueError(f"Trainer.fit: the loaded run stopped after step {self.step} of "
                             f"epoch {self.epoch + 1}, over {samples} samples in batches of "
                             f"{self.batch_size}; resume it on the same data ({n} samples "
                             f"given)")
        return self.step

    @staticmethod
    def _epoch_loss(losses, sizes, skipped):
        """Mean loss over the epoch's samples: each step's mean weighted by its
        batch size (the last batch may be smaller); skipped steps left out
        (NaN when every step was skipped)."""
        keep = np.ones(len(losses), bool)
        keep[skipped] = False
        if not keep.any():
            return float("nan")
        return float(np.average(losses[keep], weights=sizes[keep]))

    def _check_nonfinite(self, log, start, stop, epoch, skipped):
        """Raise ``NonFiniteLossError`` if a loss of steps [start, stop) of
        this epoch (not skipped) or a parameter is not finite.  Two flags
        read from the device; the details are read only on failure."""
        h = self.h
        # Skipped steps hold their non-finite loss on purpose: check the
        # parameters only (a step that got through had finite values).
        losses_ok = self.skip_nonfinite or h.is_fully_finite(view(h, log, start, (stop - start,)))
        if losses_ok and self.net.parameters.h.is_fully_finite(self.net.params):
            return
        losses = h.get_numpy_copy(log)[start:stop].astype(np.float64)
        bad = [] if self.skip_nonfinite else np.flatnonzero(~np.isfinite(losses))
        where = f"steps {start + 1}-{stop}" if stop - start > 1 else f"step {stop}"
        if len(bad):
            step = start + int(bad[0]) + 1
            msg = (f"Trainer: the loss became {losses[bad[0]]} at epoch {epoch}, step {step} "
                   f"(the first non-finite one of {where}, checked every {self.check_every} "
                   f"steps)")
        else:
            step = None
            msg = (f"Trainer: the parameters became non-finite at epoch {epoch} during "
                   f"{where}, while the loss stayed finite")
        raise NonFiniteLossError(
            msg + "; check the learning rate, the inputs and the labels, or pass "
            "on_nonfinite='skip' to skip steps whose loss is not finite",
            epoch, step, (start + 1, stop))

    # ------------------------------------------------------------------- state
    def state_dict(self):
        """The whole state of the run as one flat state dict: the network's
        (``"net."``), the optimizer's (``"optimizer."``), the loss scaler's
        under float16 mixed precision (``"loss_scaler."``), and the
        trainer's own (``"trainer."``): ``epoch`` and ``step`` (the position),
        ``shuffle`` (the shuffling generator's state), ``random`` (the
        handler's generator state, which dropout draws from; one per rank
        under data parallelism), ``batch_size``, and inside an epoch the
        losses of its steps so far.  Host reads: waits for the device.
        Under data parallelism a collective: every rank calls it."""
        state = checkpoint.prefixed("net.", self.net.state_dict())
        state.update(checkpoint.prefixed("optimizer.", self.optimizer.state_dict()))
        if self.net.loss_scaler is not None:
            state.update(checkpoint.prefixed("loss_scaler.",
                                             self.net.loss_scaler.state_dict()))
        mine = {"epoch": self.epoch, "step": self.step, "batch_size": self.batch_size,
                "random": self._randoms(), "engines": _conv_engines(self.net.h),
                "shuffle": self.rng.bit_generator.state if self.step == 0 else self._epoch_start}
        if self.step:
            losses, skipped, samples = self._epoch_so_far()
            mine.update({"epoch_losses": np.asarray(losses, np.float64),
                         "epoch_skipped": [int(i) for i in skipped], "samples": samples})
        state.update(checkpoint.prefixed("trainer.", mine))
        return state

    def _randoms(self):
        """The handler generators' states, one per rank (a collective under
        data parallelism: every rank calls it)."""
        random = self.net.parameters.h.random_state()
        return [random] if self._dp is None else self._dp.group.allgather_object(random)

    def load_state_dict(self, state, cast=False):
        """Restore a ``state_dict()`` of a run of the same network and
        optimizer (on any handler; loss scaler and all).  Everything is
        checked first (names, shapes, formats, the optimizer's class and
        settings, the batch size): ValueError naming the first mismatch,
        with nothing written.  The handler's random state is restored where
        the handler draws from the same generator (the same handler class);
        on another it warns, and dropout masks will differ from the saved
        run's.  Then ``fit`` resumes where the saved run stopped."""
        if not isinstance(state, Mapping):
            raise TypeError(f"Trainer.load_state_dict: expected a state dict (a mapping of "
                            f"names to arrays and values), got {type(state).__name__}")
        known = ("net.", "optimizer.", "loss_scaler.", "trainer.")
        stray = [k for k in state if not k.startswith(known)]
        if stray:
            raise ValueError(f"Trainer.load_state_dict: {stray[0]!r} is not part of a "
                             f"trainer's state (a network's state? use net.load_state_dict)")
        sub = {p: checkpoint.subset(state, p) for p in known}
        writes = [self.net.parameters.loader(sub["net."], "Trainer.load_state_dict (net.)",
                                             cast),
                  self.optimizer.loader(sub["optimizer."], cast)]
        scaler = self.net.loss_scaler
        if (scaler is None) != (not sub["loss_scaler."]):
            saved, here = ("with", "without") if sub["loss_scaler."] else ("without", "with")
            raise ValueError(f"Trainer.load_state_dict: the state is of a run {saved} float16 "
                             f"loss scaling, this trainer trains {here}: build it with the "
                             f"saved run's precision")
        if scaler is not None:
            writes.append(scaler.loader(sub["loss_scaler."], cast))
        writes.insert(0, self._trainer_loader(sub["trainer."]))
        for write in writes:
            write()
        self._step.reset()   # graphs captured before hold the old random seed

    def _trainer_loader(self, state):
        """Check the trainer's own part of a state; return what writes it."""
        c = checkpoint.ArrayChecker("Trainer.load_state_dict (trainer.)", state)
        epoch, step = c.value("epoch", int), c.value("step", int)
        batch_size = c.value("batch_size", int)
        shuffle, randoms = c.value("shuffle", dict), c.value("random", list)
        engines = c.value("engines", list)
        if epoch < 0 or step < 0:
            raise ValueError(f"Trainer.load_state_dict: epoch {epoch} and step {step} must "
                             f"be >= 0")
        partial = None
        if step:
            if batch_size != self.batch_size:
                raise ValueError(f"Trainer.load_state_dict: the run stopped inside an epoch "
                                 f"with batch_size {batch_size}; resume it with the same "
                                 f"(this trainer's is {self.batch_size})")
            losses = c.array("epoch_losses", (step,), np.float64)
            partial = (losses, list(c.value("epoch_skipped", list)),
                       c.value("samples", int))
        c.done()
        rank, size = (0, 1) if self._dp is None else (self._dp.rank, self._dp.size)
        if len(randoms) not in (1, size):
            raise ValueError(f"Trainer.load_state_dict: the state holds the random states "
                             f"of {len(randoms)} processes, this run has {size}")
        random = randoms[rank if len(randoms) == size else 0]
        h = self.net.parameters.h
        if not isinstance(random, dict):
            raise ValueError(f"Trainer.load_state_dict: 'random' must hold random_state() "
                             f"dicts, got {type(random).__name__}")
        current = h.random_state()
        same_generator = random.get("generator") == current["generator"]
        if same_generator:   # tried now, so that a bad state fails before any write
            try:
                h.set_random_state(random)
            finally:
                h.set_random_state(current)
        probe = np.random.default_rng()
        try:
            probe.bit_generator.state = shuffle
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"Trainer.load_state_dict: 'shuffle' is not a generator "
                             f"state: {e}") from None

        prefer = getattr(self.net.h, "prefer_conv_engines", None)

        def write():   # first of the writes: prefer_conv_engines checks its list itself
            if prefer is not None and engines:
                prefer(engines)
            self.rng.bit_generator.state = shuffle
            self._epoch_start = shuffle
            self.epoch, self.step, self._partial = epoch, step, partial
            if same_generator:
                h.set_random_state(random)
            else:
                warnings.warn(f"Trainer.load_state_dict: the state's random generator is "
                              f"{random.get('generator')!r}, this handler's "
                              f"{current['generator']!r}: dropout and other random "
                              f"draws go on from this handler's own state", stacklevel=4)
        return write

    def save(self, path):
        """Write the whole run (``state_dict()``) to the safetensors file
        ``path``, atomically (``layers.checkpoint.save``): a crash or a kill
        during the save leaves the previous file whole.  Under data
        parallelism every rank calls it (a collective); rank 0 writes, and
        every rank returns once the file is in place."""
        if self._dp is None or self._dp.rank == 0:
            checkpoint.save(path, self.state_dict())
        else:   # only the collective of state_dict: the rest is rank 0's to read
            self._randoms()
        if self._dp is not None and self._dp.size > 1:
            self._dp.group.broadcast_object(None)   # the others wait for rank 0's file

    def load(self, path, cast=False):
        """Restore the run saved in ``path`` (``load_state_dict``); then
        ``fit(x, y, epochs=E)`` runs the rest of the E epochs from the step
        where it stopped, and ends with the parameters an uninterrupted run
        would have, bit for bit (same handler class and data).  Under data
        parallelism every rank loads the same file."""
        self.load_state_dict(checkpoint.load(path), cast)

    # ---------------------------------------------------------------- evaluate
    def evaluate(self, x, y):
        """The loss and every metric of the trainer over (x, y), in
        inference mode (no dropout, no parameter change).

        Returns a dict: ``"loss"``, the mean loss over all samples (each
        batch's mean weighted by its size), then one entry per metric the
        trainer was built with (``metrics``), under its name, computed over
        all the outputs at once: ``{"loss": 0.31, "accuracy": 0.92}`` for
        ``metrics={"accuracy": accuracy}``, ``{"loss": 0.31}`` for a trainer
        without metrics.  These are the values ``fit`` records each epoch
        for ``eval_data``, there named ``eval_loss``, ``eval_accuracy``, ...
        x and y are checked as in ``fit``.
        """
        return self._evaluate(*self._prepare("Trainer.evaluate", x, y))

    def _evaluate(self, x, y):
        """``evaluate`` on data already checked by ``_prepare``."""
        h, net = self.h, self.net
        n = x.shape[self.batch_axis]
        # sums over batches in the compute format (float32 for a half format,
        # whose integers and sums would not stay exact)
        acc = h.twin(dtypes.compute_dtype(h.dtype))
        total, batch_loss = acc.zeros((1,)), acc.zeros((1,))
        outputs = []
        # accuracy is counted on the device, batch by batch, where the shapes
        # allow (2-D outputs); the other metrics need the outputs on the host.
        # It is counted in acc's format, where the labels are (the loss's) and
        # the argmax of more classes than a half format counts stays exact.
        on_device = {k for k, fn in self.metrics.items() if fn is accuracy}
        counter, correct = (DeviceAccuracy(acc), acc.zeros((1,))) if on_device else (None, None)
        widened = {}                 # shape -> outputs cast into acc's format
        first = True
        for xb, yb in self._uploads(x, y, False):
            loss, out = net.evaluate_batch(xb, yb)
            nb = yb.shape[0]
            if acc is not h:
                acc.cast_t(loss, batch_loss)
                loss = batch_loss
            acc.axpby(float(nb), loss, 1.0, total)   # sum of per-sample losses, on the device
            if first and on_device and not counter.supports(out, yb):
                on_device = set()   # shapes hold for every batch: the host for all of them
            first = False
            if on_device:
                scored = out
                if out.dtype != acc.dtype:   # cast exactly into acc's format
                    scored = widened.get(out.shape)
                    if scored is None:
                        scored = widened[out.shape] = acc.allocate(out.shape)
                    acc.cast_t(out, scored)
                acc.axpby(1.0, counter.count(scored, yb), 1.0, correct)
            if len(on_device) < len(self.metrics):
                outputs.append(h.get_numpy_copy(out))
        result = {"loss": float(acc.get_numpy_copy(total)[0]) / n}
        if self.metrics:
            fetched = np.concatenate(outputs) if len(outputs) else None
            hits = float(acc.get_numpy_copy(correct)[0]) if on_device else None
            for name, fn in self.metrics.items():
                if name in on_device:
                    result[name] = hits / n if n else float("nan")
                else:
                    result[name] = fn(fetched, y)
        return result


def _conv_engines(h):
    """The convolution engines ``h`` chose (a GPU handler times cuDNN's
    candidates, so another process may choose others and differ in the last
    bits: a resumed run takes these), or [] for a handler that does not choose."""
    engines = getattr(h, "conv_engines", None)
    return engines() if engines is not None else []


def half_grads(net, optimizer, data_parallel=False, skip_nonfinite=False):
    """The half gradients ``optimizer`` steps by directly, or None.

    Under mixed precision with no loss scaler (bfloat16), in one process
    (not ``data_parallel``), with an optimizer that takes them
    (``takes_grads``: ``SGD``) and no skip check (which reads the master
    gradients), a step need not cast the gradients into the master format:
    on an H200 that cast took 118 us of the bfloat16 MLP step's 2.08 ms.
    ``net.grads`` is then not written by such steps.  Their updates also
    write the working copy (``SGD.step(working=...)``: :func:`update`), so
    their forward passes skip its cast (``train_step(refresh=False)``), and
    whoever runs them refreshes the copy (``net.refresh_working()``) before
    the first and wherever else the master parameters may have changed
    (``Trainer``: at the start of every epoch)."""
    if (net.compute is None or net.loss_scaler is not None or data_parallel
            or skip_nonfinite or not getattr(optimizer, "takes_grads", False)):
        return None
    return net.compute[1]


def update(net, optimizer, half, clip_norm=None):
    """The optimizer's step after ``net.train_step(..., master_grads=half is
    None, refresh=half is None)``: by the half gradients ``half``
    (:func:`half_grads`), writing the working copy too, else by the master
    gradients, through the loss scaler where there is one (float16: the
    update gated on the device, a skip not seen here).  With
    ``clip_norm``, the gradients it steps by are clipped to that global
    norm first (``clip_grad_norm``)."""
    scaler = net.loss_scaler   # through a DataParallel too (its __getattr__)
    if clip_norm is not None:
        clip_grad_norm(net.parameters, clip_norm, grads=half)
    if half is not None:
        optimizer.step(grads=half, working=net.compute[0])
    elif scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)


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

    def __init__(self, net, optimizer, graph, skip_nonfinite=False, half_grads=None,
                 clip_norm=None):
        self.net, self.optimizer, self.h = net, optimizer, net.h
        self.graph = graph
        self.clip_norm = clip_norm
        self.skip_nonfinite = skip_nonfinite
        self.half_grads = half_grads   # the module's half_grads for this step
        self._sets = []             # [x, y, loss, Graph or None] per destination
        self._warm = False

    def reset(self):
        """Forget the destinations and graphs (a restored state: a graph
        holds the random seed it was captured with); the next full batch
        warms up and captures again."""
        self._sets, self._warm = [], False

    @property
    def captured(self):
        """The graphs captured so far."""
        return [s[3] for s in self._sets if s[3] is not None]

    def destinations(self, x_shape, y_shape, hx, hy):
        """``into`` for ``prefetch`` of batches of these shapes (None with
        graphs off), x an array of ``hx`` and y of ``hy`` (the network's
        ``input_h`` and ``target_h``); the arrays and graphs are kept while
        the shapes and formats hold."""
        if not self.graph:
            return None
        first = self._sets[0] if self._sets else None
        if first is None or (first[0].shape, first[1].shape) != (x_shape, y_shape) \
                or (first[0].dtype, first[1].dtype) != (hx.dtype, hy.dtype):
            self._sets = [[hx.allocate(x_shape), hy.allocate(y_shape), self.h.zeros((1,)), None]
                          for _ in range(self.DEPTH)]
        return [(s[0], s[1]) for s in self._sets]

    def _eager(self, xb, yb, out):
        """One step without a capture; False if it was skipped."""
        h = self.h
        half = self.half_grads
        # the keyword only where it is used: a DataParallel's train_step has none
        loss = (self.net.train_step(xb, yb) if half is None
                else self.net.train_step(xb, yb, master_grads=False, refresh=False))
        h.copy_to(loss, out)
        # skip mode: two host reads per step, the price of deciding on the host
        master = self.net.parameters.h   # the gradients' handler (a twin in mixed precision)
        if self.skip_nonfinite and not (h.is_fully_finite(loss)
                                        and master.is_fully_finite(self.net.grads)):
            return False
        update(self.net, self.optimizer, half, self.clip_norm)
        return True

    def __call__(self, xb, yb, out):
        """Train on (xb, yb) and copy the step's loss into ``out``; returns
        False if the step was skipped (non-finite, skip mode), else True."""
        s = next((s for s in self._sets if s[0] is xb and s[1] is yb), None) \
            if self.graph else None
        if s is None:
            return self._eager(xb, yb, out)
        if not self._warm:
            self._warm = True
            return self._eager(xb, yb, out)
        if s[3] is None:
            try:
                s[3] = self.h.capture(lambda: self._eager(xb, yb, s[2]))
            except CaptureError as e:
                warnings.warn(f"Trainer: training eagerly, the step cannot be "
                              f"captured: {e}", stacklevel=3)
                self.graph = False
                return self._eager(xb, yb, out)
        s[3].replay()
        self.h.copy_to(s[2], out)
        return True
