"""The ``Layer`` base class: the contract every layer follows.

A layer is written once against the handler API (``self.h``) and runs on every
handler.  Its life:

1. construction, with sizes only (no handler yet);
2. ``bind(h)``: the network gives it its handler;
3. ``param_shapes()`` / ``init_params(rng, host)``: a ``ParameterSet`` lays the
   parameters of all layers (and of the layers they hold: ``children()``)
   out in one flat buffer, lets each layer fill its part on the host,
   uploads once, and gives the layer views in ``self.params[name]`` and
   ``self.grads[name]``;
4. ``forward(x, training)`` then ``backward(dy)``, once per step.

Rules of the contract, which the network and the optimizer rely on:

* ``forward`` returns an array owned by the layer (or, for a layer that changes
  nothing, its input); it stays valid until the layer's next ``forward`` with
  the same input shape.
* ``backward(dy)`` follows the ``forward`` of the same step, *overwrites* (does
  not accumulate into) every gradient view of the layer, and returns dL/dx, or
  None when ``self.input_grad`` is False (the first layer of a network: nobody
  needs the gradient of the data).
* Intermediate buffers are allocated through the handler once per input shape
  (``buffers``), so that no step allocates; a smaller last batch gets its own
  set.
"""
from types import SimpleNamespace


def run_bound(cache, key, h, op, *args):
    """Run fused op ``op`` on handler ``h`` and ``args`` through a call bound
    once (``FusedOp.bind``) and kept in the dict ``cache`` under ``key``, bound
    again when ``h`` or an argument differs from the bound one (an array not
    the same object, a number of another value): a caller may pass new
    arrays at any time, and one that does so at every call pays a bind each
    time, about what an unbound call costs.  The entry keeps the bound
    arguments alive, so an identity compared is never a recycled one."""
    sig = (id(h),) + tuple(a if type(a) in (int, float) else id(a) for a in args)
    entry = cache.get(key)
    if entry is None or entry[0] != sig:
        entry = cache[key] = (sig, op.bind(h, *args), (h, args))
    entry[1]()


class Layer:
    """Base of all layers; see the module docstring for the contract.

    Attributes:
        h: the handler, set by ``bind``.
        params, grads: name -> handler view into the flat parameter and
            gradient buffers, set by ``ParameterSet``.
        input_grad: whether ``backward`` computes the gradient of the input.
    """

    def __init__(self):
        self.h = None
        self.params = {}
        self.grads = {}
        self.input_grad = True
        self._cache = {}

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __reduce_ex__(self, protocol):
        # A layer in a network holds views of the network's flat buffers: a
        # copy would train linked to nothing.  Before that, it copies freely.
        if self.h is not None or self.params:
            raise TypeError(
                f"{self!r} is part of a network (its parameters are views of the network's "
                f"flat buffer) and cannot be pickled or copied; save the network's "
                f"state_dict(), build a new network, and load_state_dict() it")
        return super().__reduce_ex__(protocol)

    def bind(self, h):
        """Attach the layer, and every layer it holds (``children``), to
        handler ``h`` (and forget buffers of another)."""
        self.h = h
        self._cache = {}
        for child in self.children():
            child.bind(h)

    def children(self):
        """The layers this layer holds, in a fixed order (none: a plain
        layer).  A container (``Chain``, ``Residual``, ``Graph``) returns
        them; the network binds them, lays their parameters out in its one
        flat buffer and names them after their position in the container."""
        return ()

    def param_shapes(self):
        """Return {name: shape} of the layer's parameters, in a fixed order."""
        return {}

    def init_params(self, rng, host):
        """Fill ``host`` ({name: NumPy array of the parameter's shape}) with
        initial values drawn from the NumPy generator ``rng``."""

    def forward(self, x, training=True):
        """Compute and return the output for input ``x``; keep what ``backward``
        needs.  ``training`` False selects inference behaviour (no dropout)."""
        raise NotImplementedError

    def backward(self, dy):
        """Given dL/dy, write the parameter gradients and return dL/dx (or None
        when ``input_grad`` is False)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- helpers
    def buffers(self, key, **shapes):
        """Handler arrays of the given shapes (name=shape), allocated on the
        first call with ``key`` (typically the input shape) and returned from
        the cache afterwards, as a namespace: ``b = self.buffers(x.shape,
        y=x.shape)``, then ``b.y``."""
        return self.cached(key, lambda: SimpleNamespace(
            **{n: self.h.allocate(s) for n, s in shapes.items()}))

    def cached(self, key, build):
        """Like ``buffers`` for buffers that need more than allocation (views,
        zero fills): ``build()`` runs once per ``key`` and its result is kept."""
        b = self._cache.get(key)
        if b is None:
            b = self._cache[key] = build()
        return b

    def reshaped(self, key, a, shape):
        """``a`` seen with ``shape`` (``reshape_t``, no copy), the view made
        once per array and kept under ``key``: a new array object costs host
        time, so a step that reshapes the same arrays makes none.  An array
        of a twin's format (ids in the master format under mixed precision)
        is viewed by that twin."""
        hit = self._cache.get(("reshaped", key))
        if hit is None or hit[0] is not a or tuple(hit[1].shape) != tuple(shape):
            h = self.h if a.dtype == self.h.dtype else self.h.twin(a.dtype)
            hit = self._cache[("reshaped", key)] = (a, h.reshape_t(a, shape))
        return hit[1]

    def run_fused(self, key, op, *args):
        """Run the fused op ``op`` (``handlers.fused_op``) on ``args`` on this
        layer's handler through a bound call kept under ``key`` (see
        :func:`run_bound`): its checks done once, each run then one launch
        on a GPU, where an unbound call checks every argument each time."""
        run_bound(self._cache, ("bound", key), self.h, op, *args)

    def check_input(self, x, ndim, last=None, what="x"):
        """Raise ValueError naming the layer unless ``x`` has ``ndim``
        dimensions (an int or a tuple of allowed ones) and, if given, last
        dimension ``last``."""
        ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if len(x.shape) not in ndims or (last is not None and x.shape[-1] != last):
            want = " or ".join(f"{n}-D" for n in ndims)
            tail = f" with last dimension {last}" if last is not None else ""
            raise ValueError(f"{self!r}: {what} must be {want}{tail}, got shape {x.shape}")
