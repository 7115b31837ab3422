"""What a closed handler's ops do: raise, naming themselves.

After ``Handler.close()`` every op of the handler, of each of its
stream-group views and of each of its twins raises
``CaptureError("<op>: the handler is closed")`` (a ``RuntimeError``; its
``op`` attribute names the op) before touching any memory: the same error
on every handler class, for the contract's ops, the memory and transfer
calls, the ordering calls and fused ops (called, or bound before the close).
``close`` itself may be called again; ``with_streams`` and ``twin`` of a
format the family has still return the views, whose ops raise.

The public ops are not changed for this, so an open handler pays nothing:
they keep their checks (a bad argument still raises its own error first)
and reach a backend hook where they would issue work.  :func:`install`
replaces every such hook, and the ordering calls that bypass hooks, by a
stand-in that raises: in the handler's state (which its views share) and in
each view's own slots (``graphs.SHADOWED``, the names a capture shadows
too), for every view the handler can have, made here if need be.
"""
from .graphs import SHADOWED, CaptureError, _public_op
from .hooks import HOOKS, NAMED_BY_FIRST


def _stand_in(name):
    """A callable that raises the closed error for hook (or call) ``name``."""
    if not name.startswith("_"):      # an ordering call, the op itself
        def closed(*args, **kwargs):
            raise CaptureError(f"{name}: the handler is closed", name)
    elif name in NAMED_BY_FIRST:
        def closed(op, *args, **kwargs):
            raise CaptureError(f"{op.name}: the handler is closed", op.name)
    else:                             # the public op that called the hook
        def closed(*args, **kwargs):
            op = _public_op()
            raise CaptureError(f"{op}: the handler is closed", op)
    closed.__name__ = closed.__qualname__ = name
    return closed


def install(handler):
    """Make every op of ``handler``'s family raise the closed error (see the
    module docstring); ``Handler.close`` calls it once, after ``_close``."""
    hooks = tuple(HOOKS)   # every hook: each issues work or hands out a resource
    root = handler._views[0]
    for member in root._twins.values():   # one handler per format
        for k in range(member.num_stream_groups):
            member.with_streams(k)          # every view now: later ones come from the cache
        for name in hooks:
            setattr(member, name, _stand_in(name))   # its state, shared by its views
    for view in root._family_views():
        for name in SHADOWED:             # a view's own slots (the handler's dict for itself)
            setattr(view, name, _stand_in(name))
