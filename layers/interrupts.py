"""Keeping Ctrl-C out of the middle of an update.

An optimizer step is several ops (SGD: the velocity, then the parameters;
NumpyHandler's Adam: m, v, then p); a ``KeyboardInterrupt`` between two of
them leaves the optimizer's state a step ahead of the parameters, and a run
resumed from there trains on without a word.  :func:`deferred` holds SIGINT
back for the length of a ``with`` block and raises the interrupt when the
block ends, so such a block either runs whole or not at all.  ``Trainer.fit``
holds it for the whole loop and takes a pending interrupt at the next step
boundary (:meth:`Deferral.take`), so its steps pay nothing for it.
"""
import signal
import threading


class Deferral:
    """The SIGINT held back by the outermost :func:`deferred` block."""

    def __init__(self, previous):
        self.previous = previous     # the handler to give a held interrupt to
        self.pending = None          # (signum, frame) of the held interrupt

    def hold(self, signum, frame):
        self.pending = (signum, frame)

    def take(self):
        """Deliver a held interrupt now (``KeyboardInterrupt`` under Python's
        default handler), at a point where the state is whole."""
        if self.pending is None:
            return
        signum, frame = self.pending
        self.pending = None
        previous = self.previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:   # SIG_DFL, or a handler set outside Python
            raise KeyboardInterrupt


_active = [None]   # the Deferral of the outermost block in progress


class deferred:   # noqa: N801 - used as a function: ``with deferred() as held:``
    """Hold SIGINT back until the block ends, then deliver it.

    Only the main thread receives signals, so on any other thread (or where
    Python's handler cannot be replaced) the block runs as is.  Nested blocks
    cost nothing: the outermost one holds and delivers.  ``as`` gives the
    :class:`Deferral` (None where nothing is held).  If the block raises, its
    own exception goes out and a held interrupt is dropped.  (A class, not a
    generator: a nested block inside ``Trainer.fit`` costs a few attribute
    tests.)"""

    __slots__ = ("_deferral", "_outer")

    def __enter__(self):
        self._outer = False
        self._deferral = _active[0]
        if self._deferral is not None or \
                threading.current_thread() is not threading.main_thread():
            return self._deferral
        deferral = Deferral(signal.getsignal(signal.SIGINT))
        try:
            signal.signal(signal.SIGINT, deferral.hold)
        except ValueError:        # not the main interpreter's main thread
            return None
        _active[0] = self._deferral = deferral
        self._outer = True
        return deferral

    def __exit__(self, exc_type, exc, tb):
        if not self._outer:
            return False
        deferral = self._deferral
        _active[0] = None
        signal.signal(signal.SIGINT, deferral.previous
                      if deferral.previous is not None else signal.SIG_DFL)
        if exc_type is None:
            deferral.take()
        return False
