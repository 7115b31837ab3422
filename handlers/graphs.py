"""Graphs: record a step of ops once, then replay it as one unit of work.

``Handler.capture()`` returns a :class:`Graph`; the ops issued inside its
``with`` block are recorded instead of run, and ``Graph.replay()`` runs them
all again, in the order and on the stream groups they were issued on.  This
module holds what every handler shares: the recording (which ops were issued
on which group, and whether every forked group joined back), the checks that
raise :class:`CaptureError`, and the ``Graph`` object.  What a recording *is*
belongs to the handler: ``NumpyHandler`` keeps the list of backend calls and
replays it; ``PyCudaHandler`` turns the same calls into a CUDA graph
(``handlers.cuda.graph``) that one driver call launches.

A capture belongs to the thread that began it: while it is in progress, a
call from another thread that would issue work on the handler (or on a twin
or a view of it) raises ``CaptureError`` at once, before doing anything,
instead of being recorded into a capture it knows nothing about.

How a capture sees the ops: for its duration every view of the handler gets
instance attributes that shadow the backend hooks named in :data:`WORK_HOOKS`
(``_elementwise``, ``_dot``, ...) and the stream-ordering calls.  The public ops
validate their arguments as always and then reach these, so a bad argument
raises at capture time, exactly as it would eagerly, and nothing is recorded.
"""
import sys
import threading
import types

from . import hooks

#: The backend hooks through which every op that touches arrays issues its
#: work (``handlers.hooks``, kind "work").  A capture routes each call of one
#: of these through its recording; an op whose work bypasses them would run
#: eagerly instead of being recorded (``tests/test_graphs.py`` checks every
#: public op of ``Handler``).
WORK_HOOKS = hooks.WORK
#: What a capture shadows on each view: the work hooks and the ordering calls.
SHADOWED = WORK_HOOKS + ("record_event", "wait_event", "wait_for")


def own_methods(view, names=SHADOWED):
    """Give a stream-group view its own bound methods ``names`` (the view
    class keeps them in slots, so that a capture can shadow them per view
    while the views share one state with their handler)."""
    cls = type(view._views[0])
    for name in names:
        setattr(view, name, types.MethodType(getattr(cls, name), view))


def issue_work(view, op, fn, *args):
    """Run ``fn(*args)`` as work of the stream group of ``view`` (a handler or
    a view), for work that no backend hook issues: a process group's
    collective, say.

    Outside a capture it runs now.  Inside one it is recorded like an op
    named ``op`` and runs again, in issue order, on every replay; where the
    handler's captures also issue their calls (a CUDA stream capture) it runs
    now too, so the stream capture records what it queues.  Raises
    ``CaptureError``, as an op would, if ``view``'s group is not part of the
    capture, and ``CaptureError`` once the handler is closed (its streams are
    gone).
    """
    view._check_open(op)
    rec = view._capture_box[0]
    if rec is None:
        fn(*args)
    else:
        rec.record(view, op, lambda _view, *a: fn(*a), args)


class CaptureError(RuntimeError):
    """A call that cannot be recorded was made inside a capture, a capture
    left a stream group unjoined, or a graph was used when it cannot run.

    ``op`` names the call that raised (None when not about one call)."""

    def __init__(self, message, op=None):
        super().__init__(message)
        self.op = op


def _public_op():
    """The name of the public op whose hook is running: the nearest caller
    whose name does not start with an underscore."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_name.startswith("_"):
        f = f.f_back
    return f.f_code.co_name if f is not None else "?"


class CapturedEvent:
    """An event recorded inside a capture: it orders work within the capture
    (``wait_event`` on another group of the same capture) and nothing else."""

    __slots__ = ("inner", "recording", "clock")

    def __init__(self, inner, recording, clock):
        self.inner, self.recording, self.clock = inner, recording, clock

    def query(self):
        """Raise ``CaptureError``: the event stands for a point in a graph,
        which completes anew on every replay."""
        raise CaptureError("query: an event recorded inside a capture has no state of its own "
                           "(record one after replay() instead)", "query")

    synchronize = query


class Recording:
    """The state of one capture in progress: the groups taking part, a
    vector clock per group (how much of each group's work it is ordered
    after), the recorded backend calls and the random numbers drawn."""

    def __init__(self, handler, origin):
        self.root = handler._views[0]
        self.origin = origin
        self.thread = threading.current_thread()   # the only thread it records
        self.groups = {origin}
        self.last_op = {}               # group -> public op of its last work item
        # group -> {group k: how many of k's work items it is ordered after};
        # clock[g][g] counts g's own work items.
        self.clock = {origin: {}}
        self.calls = []                 # (hook function, view, args), in issue order
        self.rng_used = 0               # random values drawn inside the capture
        self.saved = {}                 # view -> attribute names installed on it
        self.backend = None             # the handler's own state for this capture

    # ------------------------------------------------------------- installation
    def install(self):
        """Shadow the hooks and ordering calls of every view of the handler and
        of its twins (``Handler.twin``: they issue on the same groups), all
        views created first, so one made during the capture is covered too."""
        for member in self.root._twins.values():   # one handler per format
            for k in range(member.num_stream_groups):
                member.with_streams(k)
        for view in self.root._family_views():
            attrs = {name: self._hook(view, name) for name in WORK_HOOKS}
            attrs.update(record_event=self._recorder(view), wait_event=self._waiter(view),
                         wait_for=self._joiner(view))
            for name, fn in attrs.items():
                setattr(view, name, fn)   # the handler's dict, or a view's slot
            self.saved[view] = tuple(attrs)

    def uninstall(self):
        """Remove what ``install`` put on the views."""
        for view, names in self.saved.items():
            if view is view._views[0]:     # a handler itself: the hooks are in its dict
                for name in names:
                    view.__dict__.pop(name, None)
            else:
                own_methods(view, names)
        self.saved = {}

    # ------------------------------------------------------------- recording
    def check_thread(self, op):
        """Raise ``CaptureError`` if the calling thread is not the one that
        began the capture: its work would otherwise be recorded, not run."""
        if threading.current_thread() is not self.thread:
            raise CaptureError(
                f"{op}: a capture begun by thread {self.thread.name!r} is in progress on "
                f"this handler; another thread's op would be recorded into it instead of "
                f"running, so it is refused (issue it before or after the capture, or on "
                f"another handler)", op)

    def _issue(self, view, op):
        self.check_thread(op)
        g = view.group
        if g not in self.groups:
            raise CaptureError(
                f"{op}: stream group {g} is not part of the capture begun on group "
                f"{self.origin}; fork to it first (wait_event on an event recorded inside "
                f"the capture, or wait_for a group of the capture)", op)
        mine = self.clock[g]
        mine[g] = mine.get(g, 0) + 1
        self.last_op[g] = op

    def record(self, view, op, impl, args):
        """Record ``impl(view, *args)`` as op ``op`` of ``view``'s group, to
        run in issue order on every replay; run it now too where the
        handler's captures issue their calls (a CUDA stream capture)."""
        self._issue(view, op)
        self.calls.append((impl, view, args))
        if not view._graph_defers_calls:
            impl(view, *args)

    def _hook(self, view, name):
        impl = getattr(type(view._views[0]), name)   # the class method, not a view slot

        def call(*args):
            self.record(view, _public_op(), impl, args)
        return call

    def _recorder(self, view):
        record = type(view._views[0]).record_event

        def record_event():
            self.check_thread("record_event")
            g = view.group
            if g not in self.groups:
                raise CaptureError(f"record_event: stream group {g} is not part of the "
                                   f"capture begun on group {self.origin}", "record_event")
            return CapturedEvent(record(view), self, dict(self.clock[g]))
        record_event.__doc__ = record.__doc__
        return record_event

    def _join(self, g, clock):
        if g not in self.groups:
            self.groups.add(g)
            self.clock[g] = {}
        mine = self.clock[g]
        for k, n in clock.items():
            if mine.get(k, 0) < n:
                mine[k] = n

    def _waiter(self, view):
        wait = type(view._views[0]).wait_event

        def wait_event(event):
            self.check_thread("wait_event")
            if not isinstance(event, CapturedEvent) or event.recording is not self:
                raise CaptureError("wait_event: the event was recorded outside this capture; "
                                   "inside a capture, wait only on events recorded in it "
                                   "(a graph cannot wait for work outside it)", "wait_event")
            wait(view, event.inner)
            self._join(view.group, event.clock)
        wait_event.__doc__ = wait.__doc__
        return wait_event

    def _joiner(self, view):
        wait_for = type(view._views[0]).wait_for

        def join(other):
            self.check_thread("wait_for")
            g = getattr(other, "group", None)
            if getattr(other, "_views", None) is view._views and g != view.group \
                    and g not in self.groups:
                raise CaptureError(f"wait_for: stream group {g} is not part of the capture "
                                   f"begun on group {self.origin}, so the graph cannot wait "
                                   f"for it", "wait_for")
            wait_for(view, other)      # validates other
            if g != view.group:
                clock = dict(self.clock[g])
                self._join(view.group, clock)
        join.__doc__ = wait_for.__doc__
        return join

    def draw(self, n):
        """Reserve ``n`` random values; return their offset from the first
        value the graph draws on each replay."""
        offset = self.rng_used
        self.rng_used += n
        return offset

    def unjoined(self):
        """The groups whose last work the origin group is not ordered after."""
        seen = self.clock[self.origin]
        return sorted(g for g in self.groups
                      if g != self.origin and seen.get(g, 0) < self.clock[g].get(g, 0))


class Graph:
    """Work recorded by ``Handler.capture`` and run again by :meth:`replay`.

    Use it as a context manager (``with h.capture() as g:``); the block's ops
    are recorded, not run.  A graph keeps the handler and every array its
    ops touch alive until it is closed or collected.
    """

    def __init__(self, handler):
        self._h = handler
        self._recording = None
        self._exe = None            # the handler's replayable form
        self._keep = None           # what the recorded work uses
        self.groups = ()            #: the stream groups the recorded work runs on
        self.ops = 0                #: the number of recorded backend calls

    def __repr__(self):
        state = "recording" if self._recording else "closed" if self._keep is None else "ready"
        return f"<Graph {state}: {self.ops} ops on groups {list(self.groups)}>"

    def __enter__(self):
        h = self._h
        if self._keep is not None or self._recording is not None:
            raise CaptureError("capture: this graph has been captured already", "capture")
        if h._capture_box[0] is not None:
            raise CaptureError("capture: a capture is already in progress on this handler",
                               "capture")
        h._check_open("capture")
        rec = Recording(h, h.group)
        rec.install()
        h._capture_box[0] = rec
        try:
            h._graph_begin(rec)
        except BaseException:
            h._capture_box[0] = None
            rec.uninstall()
            raise
        self._recording = rec
        return self

    def __exit__(self, exc_type, exc, tb):
        rec, self._recording = self._recording, None
        h = self._h
        try:
            unjoined = rec.unjoined() if exc_type is None else ()
            if exc_type is not None or unjoined:
                h._graph_abort(rec)
            else:
                self._exe = h._graph_end(rec)
        finally:
            h._capture_box[0] = None
            rec.uninstall()
        if unjoined:
            last = ", ".join(f"group {g} (last op {rec.last_op.get(g, '?')})" for g in unjoined)
            raise CaptureError(
                f"capture: {last} did work that group {rec.origin} never waited for; end "
                f"the capture with wait_for (or wait_event) on group {rec.origin} for each "
                f"group used", "capture")
        if exc_type is None:
            self._keep = rec.calls
            self.groups = tuple(sorted(rec.groups))
            self.ops = len(rec.calls)
        return False

    def replay(self):
        """Queue the whole recorded work again and return without waiting.

        The work runs after everything issued before the call on each group
        the capture used, and work issued later on those groups runs after
        it, as if its ops were issued again one by one.  Random ops draw fresh
        values, continuing the handler's sequence.  Raises ``CaptureError``
        if the graph is closed, was never captured, a capture is in progress
        on the handler, or the handler is closed.
        """
        h = self._h
        if self._keep is None:
            raise CaptureError("replay: the graph is " + (
                "still recording" if self._recording else "closed or was never captured"),
                "replay")
        if h._capture_box[0] is not None:
            raise CaptureError("replay: not allowed while a capture is in progress on the "
                               "handler", "replay")
        h._check_open("replay")
        h._graph_replay(self._exe, self)

    def close(self):
        """Release the graph (and the arrays it kept alive); it cannot be replayed."""
        exe, self._exe, self._keep = self._exe, None, None
        if exe is not None:
            self._h._graph_free(exe)
