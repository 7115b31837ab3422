"""Data-parallel training: one replica of the network per process.

Every rank (one process per device, see :mod:`handlers.process_group`) holds
the whole network and the whole data set, and takes its shard of every batch:
a contiguous slice of the batch's samples, the slices' sizes differing by at
most one sample.  After each backward the gradients are summed over the ranks, so
every rank's optimizer takes the same step from the same gradient, and the
parameters, broadcast from rank 0 at the start, stay identical.

What is averaged: each rank's gradient is the mean over its shard, weighted by
its shard's share of the batch, ``n_rank / N``, before the sum, so the sum is
the mean over the whole batch, the gradient single-process training computes
on that batch, whatever the shard sizes (uneven shards, a smaller last batch).
A rank whose shard would be empty (a last batch smaller than the number of
ranks) runs its step on the batch's first sample with weight 0.  The loss of a
step is summed the same way: it is the mean over the whole batch on every rank.

Buckets: the flat gradient buffer is cut into contiguous regions of about
``bucket_bytes`` along layer boundaries, from its end.  Backward produces the
gradients of the last layer first (``Sequential.backward_hook``): as soon as
every gradient of a region is written, its all-reduce starts, on a stream
group of its own (the handler's last one), while backward goes on with the
earlier layers on the others.  Before the optimizer runs, group 0 waits for
every all-reduce.  Under mixed precision the master gradients are written in
one cast after backward, so the all-reduces start then (no overlap); in
float16 the loss scaler's overflow flags are combined too, so that a step
whose gradients overflowed on any rank is skipped on every rank.

Everything a step issues, collectives included, is issued like an op, so a
data-parallel step is captured and replayed whole (``Trainer(graph=True)``).
"""
import numpy as np

from handlers.process_group import process_group as default_group

from .checkpoint import NoCopies
from .params import view

#: Bytes of gradient per all-reduce (PyTorch DDP's default bucket, 25 MiB).
BUCKET_BYTES = 25 << 20


def shard_bounds(n, rank, size):
    """``(lo, hi)``: the samples ``[lo, hi)`` of a batch of ``n`` that ``rank``
    of ``size`` takes; the sizes of the ranks' slices differ by at most one."""
    return n * rank // size, n * (rank + 1) // size


class DataParallel(NoCopies):
    """The data-parallel step of a ``Sequential`` ``net`` (see the module
    docstring); ``Trainer(net, opt, data_parallel=True)`` makes one.

    Building it is a collective: every rank builds the same network, in the
    same order.  It checks that every rank's parameter layout (layers, names,
    shapes, offsets and format) is rank 0's (ValueError naming the first rank
    that differs, on every rank) and broadcasts rank 0's parameters.  In a
    group of one it changes nothing and ``train_step`` is the network's.

    Attributes other than the ones below are the network's, so the trainer's
    step treats this object as its network.

    Args:
        net: a ``Sequential`` (mixed precision, if any, switched on first).
        process_group: a ``handlers.process_group.ProcessGroup``; by default
            ``process_group(h)`` for the network's parameter handler.
        bucket_bytes: gradient bytes per all-reduce (> 0).
        stream_group: the stream group that carries the all-reduces; by
            default the handler's last (give the handler one more group than
            the layers use, e.g. ``num_stream_groups=5`` for the LSTM, whose
            weight gradients use groups 1-3).
        timeout: seconds a collective may take (see ``process_group``).
    """

    def __init__(self, net, process_group=None, bucket_bytes=BUCKET_BYTES, stream_group=None,
                 timeout=None):
        master = net.parameters.h
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) \
                or bucket_bytes <= 0:
            raise ValueError(f"DataParallel: bucket_bytes must be a positive int, "
                             f"got {bucket_bytes!r}")
        self.net = net
        self.group = process_group if process_group is not None else default_group(master,
                                                                                   timeout)
        self.rank, self.size = self.group.rank, self.group.size
        k = master.num_stream_groups - 1 if stream_group is None else stream_group
        self._comm = master.with_streams(k)     # ValueError for a group out of range
        #: views of the flat gradient buffer, one per all-reduce, in the order
        #: backward completes them (none in a group of one)
        self.buckets = []
        if self.size == 1:
            return
        self.group.agree("parameter layout", self.layout())
        self.group.broadcast(master, net.params, root=0)
        self._weight = master.zeros((1,))       # n_rank / N of the current batch
        self._weight_value = None
        self.set_weight(1.0 / self.size)
        self._loss = master.zeros((1,))         # the weighted loss, then the global one
        # the loss in the compute format under mixed precision (made now: a
        # capture cannot allocate)
        self._loss_out = None if net.h is master else net.h.zeros((1,))
        self._plan, self.buckets = self._plan_buckets(int(bucket_bytes) // master.dtype.itemsize)

    def __getattr__(self, name):
        # Only reached for what this class does not define: the network's.
        net = self.__dict__.get("net")
        if net is None:
            raise AttributeError(name)
        return getattr(net, name)

    def __repr__(self):
        return f"DataParallel({self.net!r}, rank={self.rank}, size={self.size})"

    def layout(self):
        """This rank's parameter layout as a list of plain values: per
        parameter (its top-level layer's index, its state-dict name, shape,
        offset), then the
        format and size of the flat buffer.  ``__init__`` checks it is every
        rank's (the first item that differs names the difference)."""
        p = self.net.parameters
        return [(top, path, tuple(shape), off)
                for top, path, (_, _, off, shape) in zip(p.owners, p.names, p.entries)] + [
            ("format", p.h.dtype.name, "elements", int(p.params.shape[0]))]

    def _plan_buckets(self, elements):
        """{layer index: region} and the regions of the flat gradient buffer
        in the order backward completes them: a region is all-reduced after
        the backward of the layer that completes it (the first layer whose
        parameters it holds), once it holds ``elements`` or more."""
        p = self.net.parameters
        first = {}   # top-level layer -> its first offset (a held layer's count as its holder's)
        for top, (_, _, off, _) in zip(p.owners, p.entries):
            first[top] = min(off, first.get(top, off))
        starts = sorted(first.items())
        plan, regions, hi = {}, [], p.size
        for n, (i, lo) in enumerate(reversed(starts)):
            if hi - lo >= elements or n == len(starts) - 1:
                region = view(p.h, p.grads, lo, (hi - lo,))
                plan[i] = region
                regions.append(region)
                hi = lo
        return plan, regions

    # ------------------------------------------------------------------ batches
    def shard(self, idx):
        """This rank's part of a batch given by its sample indices ``idx``
        (a 1-D array); the first index alone when the part is empty (that
        step then runs with weight 0, see ``set_batch``)."""
        lo, hi = shard_bounds(len(idx), self.rank, self.size)
        return idx[lo:hi] if hi > lo else idx[:1]

    def shard_size(self, n):
        """The number of samples ``shard`` returns for a batch of ``n``."""
        lo, hi = shard_bounds(n, self.rank, self.size)
        return max(hi - lo, 1)

    def set_batch(self, n):
        """Weight the next steps for global batches of ``n`` samples: this
        rank's gradient and loss count ``n_rank / n`` (0 for a borrowed
        sample).  Queues a one-element fill when the weight changes; call it
        outside a capture (a captured step reads the weight when it runs)."""
        if self.size > 1:
            lo, hi = shard_bounds(int(n), self.rank, self.size)
            self.set_weight((hi - lo) / int(n))

    def set_weight(self, value):
        """Set the weight of this rank's gradient and loss (see ``set_batch``)."""
        if value != self._weight_value:
            self._weight_value = value
            self.net.parameters.h.fill(self._weight, value)

    def check_epoch(self, sizes):
        """Check that every rank runs the same epochs, global batches of
        ``sizes`` samples (a sequence): as many steps and samples
        (ValueError naming the difference otherwise)."""
        if self.size > 1:
            self.group.agree("epoch (steps, samples)", (len(sizes), int(np.sum(sizes))))

    def step_issued(self):
        """Tell the group that a training step's work was issued (its
        watchdog then checks that the work finishes): call it after the
        step, so that the step itself is watched."""
        if self.size > 1:
            self.group.step_issued(self.net.parameters.h)

    # --------------------------------------------------------------------- step
    def train_step(self, x, targets):
        """``net.train_step`` on this rank's shard, then the gradients and the
        loss summed over the ranks, each weighted (see the module docstring).
        Returns the global mean loss, a (1,) array of ``net.h``; later work
        on group 0 (the optimizer) sees the summed gradients."""
        net = self.net
        if self.size == 1:
            return net.train_step(x, targets)
        master = net.parameters.h
        mixed = net.h is not master     # mixed precision: the gradients arrive in one cast
        net.backward_hook = None if mixed else self._layer_done
        try:
            loss = net.train_step(x, targets)
        finally:
            net.backward_hook = None
        if mixed:
            for region in self.buckets:
                self._start(region)
            master.cast_t(loss, self._loss)
            loss = self._loss
        master.axpby(self._weight, loss, 0.0, self._loss)
        self._start(self._loss, weight=False)
        scaler = getattr(net, "loss_scaler", None)
        if scaler is not None:     # float16: the overflow flags, 1 where finite
            self._start(scaler.flag, weight=False)
        self.group.complete(self._comm)
        master.wait_for(self._comm)
        if scaler is not None:
            # The flags sum to size only where every rank's gradients were
            # finite: otherwise every rank skips the step and lowers its scale.
            master.add_st(1.0 - self.size, scaler.flag, scaler.flag)
            master.clip_t(scaler.flag, 0.0, 1.0, scaler.flag)
        if not mixed:
            return self._loss
        if self._loss_out is None:
            # mixed precision began after __init__ (Trainer(..., precision=...,
            # data_parallel=dp)), whose first step runs eagerly: make it now
            self._loss_out = net.h.zeros((1,))
        net.h.cast_t(self._loss, self._loss_out)
        return self._loss_out

    def _layer_done(self, i):
        """Backward finished layer ``i``: start the all-reduce its gradients
        complete, if any."""
        region = self._plan.get(i)
        if region is not None:
            self._start(region)

    def _start(self, a, weight=True):
        """Start the all-reduce of ``a`` (weighted first, with ``weight``) on
        the all-reduce group, after the work issued so far on group 0."""
        c = self._comm
        c.wait_for(self.net.parameters.h)
        if weight:
            c.axpby(self._weight, a, 0.0, a)
        self.group.allreduce(c, a)


def data_parallel_for(trainer, setting):
    """The ``DataParallel`` of a ``Trainer`` built with ``data_parallel=setting``
    (False or None: none; True: one with the defaults; or a ``DataParallel``
    of the trainer's network), with the trainer prepared for it: every rank
    checked to use the same batch size, batch axis and optimizer, the
    shuffling generator set to rank 0's state, and the progress bar shown on
    rank 0 only."""
    if setting is None or setting is False:
        return None
    if setting is True:
        dp = DataParallel(trainer.net)
    elif isinstance(setting, DataParallel):
        if setting.net is not trainer.net:
            raise ValueError("Trainer: data_parallel is a DataParallel of another network")
        dp = setting
    else:
        raise TypeError(f"Trainer: data_parallel must be a bool or a DataParallel, "
                        f"got {type(setting).__name__}")
    if dp.size > 1:
        opt = trainer.optimizer
        dp.group.agree("batch settings and optimizer",
                       (trainer.batch_size, trainer.batch_axis, type(opt).__name__,
                        getattr(opt, "lr", None)))
        state = dp.group.broadcast_object(trainer.rng.bit_generator.state)
        trainer.rng.bit_generator.state = state
        trainer.progress = trainer.progress and dp.rank == 0
    return dp
