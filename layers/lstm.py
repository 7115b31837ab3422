"""``LSTM``: a long short-term memory layer over time-major sequences.

Layout, chosen so that every array an op touches is contiguous (handler ops
take contiguous arrays only, and there is no strided view):

* weights per gate k in (i, f, g, o): ``Wx[k]`` (F, H), ``Wh[k]`` (H, H),
  ``b[k]`` (1, H), stored as ``Wx`` (4, F, H), ``Wh`` (4, H, H), ``b`` (4, 1, H);
* gate buffer ``A`` (4, T, B, H): ``A[k]`` is the gate over all steps, a
  (T*B, H) matrix, and ``A[k, t]`` the gate at one step, a (B, H) matrix.

Each step is two device calls forward and two backward, whatever H:

* forward: the input projection of all steps is one batched product (``x``
  shared by the four gates' ``Wx[k]``); then per step one batched product
  ``R = h[t-1] @ Wh`` (4, B, H) and one fused kernel (:data:`STEP`) that adds
  the projections and the bias, applies the four gate functions, and writes the
  gates (kept in ``A`` for backward), the cell state, its tanh and the hidden
  state;
* backward: per step one fused kernel (:data:`STEP_BACK`) that sums dL/dh from
  the output and from step t+1, and writes the four gate gradients (into
  ``dA`` for the weight gradients and into a (4, B, H) step buffer ``D``) and
  dL/dc of the step before; then one batched product ``P = D @ Wh^T``, the
  four parts of dL/dh[t-1] that the next kernel sums.

The weight gradients are then three ops over the whole sequence (one batched
product each for ``Wx`` and ``Wh``, one sum for ``b``) on stream groups 1, 2
and 3 while group 0 computes the input gradient; events order them after
``dA`` and the later work (the optimizer) after them.

The fused step calls are bound to their arrays once per sequence shape
(:meth:`handlers.FusedOp.bind`; backward again when ``dy`` is a new array): the
checks of 20 arguments would otherwise cost the host more than the launch.
"""
from types import SimpleNamespace

from handlers.fused import fused_op

from . import init
from .base import Layer
from .params import index, view

GATES = "ifgo"

#: One forward step: gate pre-activations are the input projection x*, the
#: recurrent part r* and the bias b*; cp is the previous cell state.
STEP = fused_op(
    "lstm_step", inputs="xi xf xg xo ri rf rg ro bi:row bf:row bg:row bo:row cp",
    outputs="i f g o c tc hh", body="""
i = sigmoid(xi + ri + bi)
f = sigmoid(xf + rf + bf)
g = tanh(xg + rg + bg)
o = sigmoid(xo + ro + bo)
c = f * cp + i * g
tc = tanh(c)
hh = o * tc
""")

#: One backward step: dy is dL/dh[t] from the output, p0..p3 its four parts
#: from step t+1, dcn dL/dc[t] from step t+1; i f g o tc are the step's
#: activations, cp the previous cell state.  The gate gradients are written
#: twice (to dA[k, t] as a*, to the step buffer D as d*).
STEP_BACK = fused_op(
    "lstm_step_back", inputs="dy p0 p1 p2 p3 dcn i f g o tc cp",
    outputs="ai af ag ao d0 d1 d2 d3 dcp", body="""
dh = dy + p0 + p1 + p2 + p3
dc = dcn + dh * o * (1 - tc * tc)
ai = dc * g * i * (1 - i)
af = dc * cp * f * (1 - f)
ag = dc * i * (1 - g * g)
ao = dh * tc * o * (1 - o)
d0 = ai
d1 = af
d2 = ag
d3 = ao
dcp = dc * f
""")


class LSTM(Layer):
    """LSTM layer; input (T, B, F), output (T, B, H) or, with
    ``return_sequences=False``, the last step's hidden state (B, H).

    The initial hidden and cell states are 0.  Gates follow the usual
    equations: i, f, o = sigmoid(.), g = tanh(.), c = f*c' + i*g,
    h = o*tanh(c).  Input weights start Glorot-uniform, recurrent weights
    orthogonal, biases 0 except the forget gate's at 1 (remember by default).
    """

    def __init__(self, n_in, n_hidden, return_sequences=True):
        super().__init__()
        self.n_in, self.n_hidden = int(n_in), int(n_hidden)
        self.return_sequences = bool(return_sequences)

    def __repr__(self):
        return (f"LSTM({self.n_in}, {self.n_hidden}, "
                f"return_sequences={self.return_sequences})")

    def param_shapes(self):
        F, H = self.n_in, self.n_hidden
        return {"Wx": (4, F, H), "Wh": (4, H, H), "b": (4, 1, H)}

    def init_params(self, rng, host):
        for k in range(4):
            init.glorot_uniform(rng, host["Wx"][k], self.n_in, self.n_hidden)
            init.orthogonal(rng, host["Wh"][k])
        init.constant(host["b"], 0.0)
        init.constant(host["b"][GATES.index("f")], 1.0)

    # ------------------------------------------------------------------ views
    def _param_views(self):
        """Per-gate views of the parameters (made once)."""
        h, H = self.h, self.n_hidden
        return self.cached("params", lambda: SimpleNamespace(
            Wx=[index(h, self.params["Wx"], k) for k in range(4)],
            b=[index(h, self.params["b"], k) for k in range(4)],
            db2=view(h, self.grads["b"], 0, (4, H))))

    def _bufs(self, T, B):
        """Buffers and their per-gate / per-step views for sequences (T, B)."""
        def build():
            h, F, H = self.h, self.n_in, self.n_hidden
            A = h.allocate((4, T, B, H))       # gate activations (projections at first)
            dA = h.allocate((4, T, B, H))      # gradients of the gate pre-activations
            C = h.zeros((T + 1, B, H))         # cell states, C[0] = initial state 0
            Hs = h.zeros((T + 1, B, H))        # hidden states, Hs[0] = initial state 0
            TC = h.allocate((T, B, H))         # tanh of the cell states
            R = h.allocate((4, B, H))          # the recurrent products of one step
            D = h.allocate((4, B, H))          # the gate gradients of one step
            P = h.zeros((4, B, H))             # the parts of dL/dh from the step after
            zero = h.zeros((B, H))
            dX = h.allocate((T, B, F))
            return SimpleNamespace(
                A=A, C=C, Hs=Hs, TC=TC, R=R, D=D, P=P, zero=zero, dX=dX,
                dc=h.allocate((B, H)), steps=None, dY=None, back=None,
                # whole-sequence views, for the products over all steps
                A3=view(h, A, 0, (4, T * B, H)),
                dA3=view(h, dA, 0, (4, T * B, H)),
                dA2=[view(h, dA, k * T * B * H, (T * B, H)) for k in range(4)],
                Hprev2=view(h, Hs, 0, (T * B, H)),             # h[-1] .. h[T-2]
                Y=view(h, Hs, B * H, (T, B, H)),               # h[0] .. h[T-1]
                last=index(h, Hs, T),
                dX2=view(h, dX, 0, (T * B, F)),
                # per-step views: [t][k] for gates, [t] for states
                At=[[view(h, A, (k * T + t) * B * H, (B, H)) for k in range(4)]
                    for t in range(T)],
                dAt=[[view(h, dA, (k * T + t) * B * H, (B, H)) for k in range(4)]
                     for t in range(T)],
                Rk=[index(h, R, k) for k in range(4)],
                Dk=[index(h, D, k) for k in range(4)],
                Pk=[index(h, P, k) for k in range(4)],
                Ct=[index(h, C, t) for t in range(T + 1)],
                Ht=[index(h, Hs, t) for t in range(T + 1)],
                TCt=[index(h, TC, t) for t in range(T)],
            )
        return self.cached((T, B), build)

    # ---------------------------------------------------------------- forward
    def forward(self, x, training=True):
        self.check_input(x, 3, self.n_in)
        h = self.h
        T, B, _ = x.shape
        p = self._param_views()
        b = self._bufs(T, B)
        x2 = view(h, x, 0, (T * B, self.n_in))
        h.dot_mm(x2, self.params["Wx"], b.A3)      # input projections of all steps and gates
        if b.steps is None:   # h[-1] is 0: the first step has no recurrent product
            b.steps = [STEP.bind(h, *b.At[t], *(b.Rk if t else [b.zero] * 4), *p.b, b.Ct[t],
                                 *b.At[t], b.Ct[t + 1], b.TCt[t], b.Ht[t + 1])
                       for t in range(T)]
        for t in range(T):
            if t > 0:
                h.dot_mm(b.Ht[t], self.params["Wh"], b.R)
            b.steps[t]()
        self._x2, self._b, self._T, self._B = x2, b, T, B
        return b.Y if self.return_sequences else b.last

    # --------------------------------------------------------------- backward
    def backward(self, dy):
        h, b, T = self.h, self._b, self._T
        want = (T, self._B, self.n_hidden) if self.return_sequences else (self._B, self.n_hidden)
        if dy.shape != want:
            raise ValueError(f"{self!r}: dy must have the output's shape {want}, got {dy.shape}")
        if b.dY is not dy:    # the steps' calls, bound again for a new dy array
            b.dY, b.back = dy, [self._bind_back(b, dy, t) for t in range(T)]
        for t in range(T - 1, -1, -1):
            b.back[t]()
            if t > 0:
                h.dot_mm(b.D, self.params["Wh"], b.P, transb=True)   # parts of dL/dh[t-1]
        self._weight_gradients(self._param_views(), b)
        if not self.input_grad:
            return None
        return b.dX

    def _bind_back(self, b, dy, t):
        """Step t's backward gate math (STEP_BACK) bound to its arrays."""
        last = t == self._T - 1
        if self.return_sequences:
            dy_t = index(self.h, dy, t)
        else:
            dy_t = dy if last else b.zero
        parts = [b.zero] * 4 if last else b.Pk     # dL/dh[t] from step t+1
        dcn = b.zero if last else b.dc              # dL/dc[t] from step t+1
        return STEP_BACK.bind(self.h, dy_t, *parts, dcn, *b.At[t], b.TCt[t], b.Ct[t],
                              *b.dAt[t], *b.Dk, b.dc)

    def _weight_gradients(self, p, b):
        """Weight and bias gradients on side stream groups, the input
        gradient on group 0 meanwhile; group 0 then waits for them."""
        h = self.h
        n = h.num_stream_groups
        ready = h.record_event()          # dA is complete on group 0
        work = [lambda g: g.dot_mm(self._x2, b.dA3, self.grads["Wx"], transa=True),   # x^T dA
                lambda g: g.dot_mm(b.Hprev2, b.dA3, self.grads["Wh"], transa=True),   # h'^T dA
                lambda g: g.sum_t(b.dA3, 1, p.db2)]                                   # over T, B
        sides = {}
        for k, fn in enumerate(work):
            g = h.with_streams(1 + k % (n - 1)) if n > 1 else h
            if g.group not in sides:
                g.wait_event(ready)
                sides[g.group] = g
            fn(g)
        if self.input_grad:
            h.dot_mm(b.dA2[0], p.Wx[0], b.dX2, transb=True)         # dx = sum_k dA_k Wx_k^T
            for k in range(1, 4):
                h.dot_add_mm(b.dA2[k], p.Wx[k], b.dX2, transb=True)
        for g in sides.values():
            h.wait_for(g)                 # later group-0 work sees the gradients
