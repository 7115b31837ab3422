"""``LSTM``: a long short-term memory layer over time-major sequences.

Layout, chosen so that every array an op touches is contiguous (handler ops
take contiguous arrays only, and there is no strided view):

* weights per gate k in (i, f, g, o): ``Wx[k]`` (F, H), ``Wh[k]`` (H, H),
  ``b[k]`` (1, H);
* gate buffer ``A`` (4, T, B, H): ``A[k]`` is the gate over all steps, a
  (T*B, H) matrix, and ``A[k, t]`` the gate at one step, a (B, H) matrix.

With gates side by side in one (B, 4H) matrix a step would be one gemm instead
of four, but the elementwise ops could not address one gate.

Forward: the input projection of all steps is one gemm per gate, then each
step adds ``h[t-1] @ Wh[k]`` and applies the gate functions.  Backward runs the
recurrence back in time for the gate gradients ``dA``; then the weight
gradients of the four gates are eight independent gemms and four bias sums over
the whole sequence, issued on stream groups 1, 2, 3, ... while group 0 computes
the input gradient.  The events around them order them after ``dA`` and the
later work (the optimizer) after them.
"""
from types import SimpleNamespace

from . import init
from .base import Layer
from .params import index, view

GATES = "ifgo"
#: handler op of each gate's nonlinearity
_GATE_OP = {"i": "sigmoid", "f": "sigmoid", "g": "tanh", "o": "sigmoid"}


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
        """Per-gate views of the parameters and gradients (made once)."""
        h = self.h
        return self.cached("params", lambda: SimpleNamespace(**{
            name: [index(h, store[key], k) for k in range(4)]
            for name, store, key in (("Wx", self.params, "Wx"), ("Wh", self.params, "Wh"),
                                     ("b", self.params, "b"), ("dWx", self.grads, "Wx"),
                                     ("dWh", self.grads, "Wh"), ("db", self.grads, "b"))}))

    def _bufs(self, T, B):
        """Buffers and their per-gate / per-step views for sequences (T, B)."""
        def build():
            h, F, H = self.h, self.n_in, self.n_hidden
            A = h.allocate((4, T, B, H))       # gate activations (pre-activations at first)
            dA = h.allocate((4, T, B, H))      # gradients of the gate pre-activations
            C = h.zeros((T + 1, B, H))         # cell states, C[0] = initial state 0
            Hs = h.zeros((T + 1, B, H))        # hidden states, Hs[0] = initial state 0
            TC = h.allocate((T, B, H))         # tanh of the cell states
            dX = h.allocate((T, B, F))
            b = SimpleNamespace(
                A=A, C=C, Hs=Hs, TC=TC, dX=dX,
                dh=h.allocate((B, H)), dc=h.allocate((B, H)), tmp=h.allocate((B, H)),
                dY_seq=None,
                # whole-sequence matrices, for the gemms over all steps
                A2=[view(h, A, k * T * B * H, (T * B, H)) for k in range(4)],
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
                Ct=[index(h, C, t) for t in range(T + 1)],
                Ht=[index(h, Hs, t) for t in range(T + 1)],
                TCt=[index(h, TC, t) for t in range(T)],
            )
            return b
        return self.cached((T, B), build)

    # ---------------------------------------------------------------- forward
    def forward(self, x, training=True):
        self.check_input(x, 3, self.n_in)
        h = self.h
        T, B, _ = x.shape
        p = self._param_views()
        b = self._bufs(T, B)
        x2 = view(h, x, 0, (T * B, self.n_in))
        for k in range(4):   # input projections of all steps at once, plus bias
            h.dot_mm(x2, p.Wx[k], b.A2[k])
            h.add_mv(b.A2[k], p.b[k], b.A2[k])
        for t in range(T):
            a = b.At[t]
            if t > 0:        # h[-1] is 0: skip the recurrent gemms of the first step
                for k in range(4):
                    h.dot_add_mm(b.Ht[t], p.Wh[k], a[k])
            for k, g in enumerate(GATES):
                getattr(h, _GATE_OP[g])(a[k], a[k])     # in place: A keeps activations
            i, f, g, o = a
            if t == 0:                                  # c' = 0: c = i * g
                h.mult_tt(i, g, b.Ct[1])
            else:
                h.mult_tt(f, b.Ct[t], b.Ct[t + 1])      # c = f * c'
                h.mult_add_tt(i, g, b.Ct[t + 1])        #   + i * g
            h.tanh(b.Ct[t + 1], b.TCt[t])
            h.mult_tt(o, b.TCt[t], b.Ht[t + 1])         # h = o * tanh(c)
        self._x2, self._b, self._T, self._B = x2, b, T, B
        return b.Y if self.return_sequences else b.last

    # --------------------------------------------------------------- backward
    def backward(self, dy):
        h, b, T = self.h, self._b, self._T
        want = (T, self._B, self.n_hidden) if self.return_sequences else (self._B, self.n_hidden)
        if dy.shape != want:
            raise ValueError(f"{self!r}: dy must have the output's shape {want}, got {dy.shape}")
        p = self._param_views()
        if self.return_sequences:
            dys = [index(h, dy, t) for t in range(T)] if b.dY_seq is not dy else b.dys
            b.dY_seq, b.dys = dy, dys
        for t in range(T - 1, -1, -1):
            a, da = b.At[t], b.dAt[t]
            i, f, g, o = a
            # dL/dh[t]: from the output at t (sequences) and from step t+1
            if t == T - 1:
                dh = dys[t] if self.return_sequences else dy
            else:
                dh = b.dh
                if self.return_sequences:
                    h.add_tt(dh, dys[t], dh)
            h.mult_tt(dh, b.TCt[t], b.tmp)                 # do = dh * tanh(c)
            h.sigmoid_deriv(o, o, b.tmp, da[3])
            h.mult_tt(dh, o, b.tmp)                        # dc += dh * o * (1 - tanh(c)^2)
            if t == T - 1:                                 # dc starts here
                h.tanh_deriv(b.TCt[t], b.TCt[t], b.tmp, b.dc)
            else:
                h.tanh_deriv(b.TCt[t], b.TCt[t], b.tmp, b.tmp)
                h.add_tt(b.dc, b.tmp, b.dc)
            h.mult_tt(b.dc, g, b.tmp)                      # di = dc * g
            h.sigmoid_deriv(i, i, b.tmp, da[0])
            h.mult_tt(b.dc, i, b.tmp)                      # dg = dc * i
            h.tanh_deriv(g, g, b.tmp, da[2])
            h.mult_tt(b.dc, b.Ct[t], b.tmp)                # df = dc * c'
            h.sigmoid_deriv(f, f, b.tmp, da[1])
            if t > 0:
                h.mult_tt(b.dc, f, b.dc)                   # dc' = dc * f
                h.dot_mm(da[0], p.Wh[0], b.dh, transb=True)    # dh' = sum_k dA_k Wh_k^T
                for k in range(1, 4):
                    h.dot_add_mm(da[k], p.Wh[k], b.dh, transb=True)
        self._weight_gradients(p, b)
        if not self.input_grad:
            return None
        return b.dX

    def _weight_gradients(self, p, b):
        """Weight and bias gradients of the four gates on side stream groups,
        the input gradient on group 0 meanwhile; group 0 then waits for them."""
        h = self.h
        n = h.num_stream_groups
        ready = h.record_event()          # dA is complete on group 0
        sides = {}
        for k in range(4):
            g = h.with_streams(1 + k % (n - 1)) if n > 1 else h
            if g.group not in sides:
                g.wait_event(ready)
                sides[g.group] = g
            g.dot_mm(self._x2, b.dA2[k], p.dWx[k], transa=True)     # dWx = x^T dA
            g.dot_mm(b.Hprev2, b.dA2[k], p.dWh[k], transa=True)     # dWh = h_prev^T dA
            g.sum_t(b.dA2[k], 0, p.db[k])                           # db = sum over T, B
        if self.input_grad:
            h.dot_mm(b.dA2[0], p.Wx[0], b.dX2, transb=True)         # dx = sum_k dA_k Wx_k^T
            for k in range(1, 4):
                h.dot_add_mm(b.dA2[k], p.Wx[k], b.dX2, transb=True)
        for g in sides.values():
            h.wait_for(g)                 # later group-0 work sees the gradients
