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


def not_initialized(layer, name=None):
    """The message for ``layer``, a ``Layer`` whose ``__init__`` did not run
    ``Layer.__init__`` (``name``: the attribute found missing, if any)."""
    cls = type(layer).__name__
    missing = f"{cls} has no attribute {name!r}: " if name else ""
    return (f"{missing}{cls}.__init__ did not call Layer.__init__; call "
            f"super().__init__() first thing in {cls}.__init__ (it sets h, params, grads, "
            f"input_grad and the buffer cache that every layer needs)")


def check_initialized(layer, where):
    """TypeError, prefixed with ``where``, if ``layer`` is a ``Layer`` whose
    ``__init__`` skipped ``Layer.__init__`` (see :func:`not_initialized`)."""
    if isinstance(layer, Layer) and not all(hasattr(layer, n) for n in INIT_ATTRIBUTES):
        raise TypeError(f"{where}: {not_initialized(layer)}")


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
        # INIT_ATTRIBUTES (end of this module) is what this sets
        self.h = None
        self.params = {}
        self.grads = {}
        self.input_grad = True
        self._cache = {}

    def __getattr__(self, name):
        # Called only when the normal lookup fails, so it costs nothing where
        # the attribute exists (every step's self.h, self.params, ...).  It
        # turns the AttributeError of a subclass whose __init__ skipped
        # Layer.__init__ into one that says so; any other name gets Python's
        # usual error, so hasattr, getattr(..., default), copy and pickle
        # behave as without it.  Its own code reads no attribute of the
        # instance, which may be half built (unpickling, copy): a read
        # would come back here.
        if name in INIT_ATTRIBUTES:
            raise AttributeError(not_initialized(self, name), name=name, obj=self)
        if any(name in vars(c) for c in type(self).__mro__):
            # a property whose getter raised AttributeError lands here too:
            # run it again, so that its own error shows, not "no attribute"
            return object.__getattribute__(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                             name=name, obj=self)

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
        y=x.shape)``, then ``b.y``.

        The first call with a key names *every* buffer of that key, with its
        shape (``forward``, which sees the input shape first); a later call
        may name none (``backward``: ``self.buffers(dy.shape)``, for a layer
        whose output has its input's shape) or some of them (their shapes
        are not compared).  TypeError, at the call, for a key never seen
        with no shapes given (a backward whose ``dy`` has another shape than
        the ``forward`` key: key both by the same shape) and for a name the
        key's first call did not give."""
        b = self._cache.get(key)
        if b is None:
            if not shapes:
                raise TypeError(
                    f"{self!r}: self.buffers({key!r}) with no shapes, but no buffers were "
                    f"allocated for the key {key!r} yet: the first call with a key must "
                    f"give every buffer's shape, name=shape (in forward, say: "
                    f"self.buffers(x.shape, y=..., dx=...)), and later calls use the same "
                    f"key (in backward, the forward's input shape, not dy.shape where "
                    f"they differ)")
            b = self._cache[key] = SimpleNamespace(
                **{n: self.h.allocate(s) for n, s in shapes.items()})
        elif shapes and not shapes.keys() <= getattr(b, "__dict__", {}).keys():
            self._unknown_buffers(key, shapes, b)
        return b

    def _unknown_buffers(self, key, shapes, b):
        """Raise the TypeError of ``buffers`` for names the key lacks."""
        have = sorted(getattr(b, "__dict__", {}))
        new = [n for n in shapes if n not in have]
        raise TypeError(
            f"{self!r}: self.buffers({key!r}, ...) asks for {', '.join(new)}, but the key's "
            f"first call allocated only {', '.join(have) or 'other cached values'}: name "
            f"every buffer of a key, with its shape, in its first call (or use another key)")

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


#: The attributes ``Layer.__init__`` sets (those of a bare ``Layer``): a
#: subclass whose ``__init__`` does not call ``super().__init__()`` lacks them.
INIT_ATTRIBUTES = tuple(vars(Layer()))
