"""``LossScaler``: dynamic loss scaling for float16 mixed precision, decided
on the device (no host read per step)."""
import numpy as np

from handlers.checks import check_scalar

from . import interrupts
from .checkpoint import ArrayChecker, NoCopies
from .params import view


class LossScaler(NoCopies):
    """Dynamic loss scaling for a network that computes in float16.

    float16 holds nothing below 2^-24, so small gradients vanish on the way
    back through the layers.  The scaler multiplies the loss gradient by a
    scale S before backward (gradients S times larger stay representable),
    and divides the master gradients by S after they are carried into the
    master format.  Where any gradient overflowed to inf or NaN, the step is
    skipped (parameters and optimizer state untouched) and S halves; after
    ``interval`` finite steps in a row S doubles, up to ``max_scale``.

    Everything is decided on the device: ``scale_finite_t`` writes a flag
    (1 if every gradient was finite), the optimizer's update is gated by it
    (``Adam``: ``adam_update``'s gate; ``SGD``: gated device scalars), and
    ``update_loss_scale`` moves S.  A step so scaled can be captured as a
    graph.  ``Sequential.mixed_precision("float16")`` makes one
    (``net.loss_scaler``) and ``Trainer`` drives it; a hand-written loop calls
    ``net.train_step`` and then ``net.loss_scaler.step(optimizer)`` in place
    of ``optimizer.step()``.

    Args:
        net: a ``Sequential`` in mixed precision (``net.compute`` set).
        init_scale: the first S, a power of two.
        interval: finite steps in a row before S doubles (an int >= 1).
        max_scale: the largest S, at most 2^15 (S is held in float16 to
            scale the loss gradient, and 2^16 is past float16's range).
    """

    def __init__(self, net, init_scale=2.0 ** 15, interval=2000, max_scale=2.0 ** 15):
        if net.compute is None:
            raise ValueError("LossScaler: the network is not in mixed precision "
                             "(net.mixed_precision)")
        max_scale = check_scalar("LossScaler", "max_scale", max_scale)
        init_scale = check_scalar("LossScaler", "init_scale", init_scale)
        if not 0.0 < max_scale <= 2.0 ** 15:
            raise ValueError(f"LossScaler: max_scale must be in (0, 2^15], got {max_scale}")
        if not 0.0 < init_scale <= max_scale:
            raise ValueError(f"LossScaler: init_scale must be in (0, max_scale], "
                             f"got {init_scale}")
        if isinstance(interval, bool) or not isinstance(interval, (int, np.integer)) \
                or interval < 1:
            raise ValueError(f"LossScaler: interval must be an int >= 1, got {interval!r}")
        self.interval, self.max_scale = int(interval), float(max_scale)
        self.master, self.hc = net.parameters.h, net.h
        m = self.master
        # [scale, 1 / scale, finite steps in a row, steps skipped]
        self._state = m.create_from_numpy(np.array([init_scale, 1.0 / init_scale, 0.0, 0.0]))
        self._inverse = view(m, self._state, 1, (1,))
        self._scale_master = view(m, self._state, 0, (1,))
        #: 1 if every gradient of the last step was finite, else 0 (the gate)
        self.flag = m.ones((1,))
        self._scale_c = self.hc.zeros((1,))   # S in the compute format

    def scale(self, dy):
        """Multiply the loss gradient ``dy`` (of the compute handler) by S."""
        self.hc.cast_t(self._scale_master, self._scale_c)
        self.hc.axpby(self._scale_c, dy, 0.0, dy)

    def unscale(self, grads):
        """Divide the master gradients by S, zeroing and flagging any that
        are not finite (``self.flag``)."""
        self.master.scale_finite_t(grads, self._inverse, self.flag)

    def step(self, optimizer):
        """The optimizer's update, gated by ``flag``, then S's update (a
        Ctrl-C is raised after both: ``layers.interrupts``)."""
        with interrupts.deferred():
            optimizer.step(gate=self.flag)
            self.master.update_loss_scale(self.flag, self._state, self.interval,
                                          self.max_scale)

    # ------------------------------------------------------------------ state
    def state_dict(self):
        """``{"interval", "max_scale"}`` and ``"state"``, the device's four
        values [S, 1 / S, finite steps in a row, steps skipped] in the
        master format (a host read: waits for the device)."""
        return {"interval": self.interval, "max_scale": self.max_scale,
                "state": self.master.get_numpy_copy(self._state)}

    def loader(self, state, cast=False):
        """Check ``state`` (a ``state_dict()``) and return the function that
        writes it; ValueError naming the first mismatch, before anything is
        written."""
        c = ArrayChecker("LossScaler.load_state_dict", state, cast)
        interval = c.value("interval", int)
        max_scale = float(c.value("max_scale", (int, float)))
        values = c.array("state", (4,), self.master.dtype).astype(np.float64)
        c.done()
        if interval < 1 or not 0.0 < max_scale <= 2.0 ** 15 \
                or not 0.0 < values[0] <= max_scale or not np.isfinite(values).all():
            raise ValueError(f"LossScaler.load_state_dict: not a loss scaler's state: "
                             f"interval {interval}, max_scale {max_scale}, state {values}")

        def write():
            self.interval, self.max_scale = interval, max_scale
            self.master.set_from_numpy(self._state, values)
        return write

    def load_state_dict(self, state, cast=False):
        """Restore the scale, its counters and settings from ``state`` (see
        ``loader``); nothing is written unless all of it fits."""
        self.loader(state, cast)()

    def read(self):
        """``(S, steps skipped so far)``, in one host read (waits for the device)."""
        state = self.master.get_numpy_copy(self._state)
        return float(state[0]), int(state[3])

    @property
    def loss_scale(self):
        """The current S (a host read: waits for the device)."""
        return self.read()[0]

    @property
    def skipped(self):
        """Steps skipped so far for non-finite gradients (a host read)."""
        return self.read()[1]
