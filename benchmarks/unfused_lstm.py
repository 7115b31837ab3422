"""The LSTM layer as it was before issue 20's fusion (commit f51380e), kept as
the same-run baseline of ``benchmarks train``'s issue-20 targets ("the eager
step <= 0.5x our eager step before fusion").

Every step issues each gate's gemm and each elementwise op on its own: four
recurrent gemms, about ten elementwise ops forward and twenty backward per
step, eight weight-gradient gemms and four bias sums.  Same parameters, same
layout and same results as :class:`layers.LSTM`; only the op count differs.
Benchmark code, not part of the library.
"""
from types import SimpleNamespace

from layers.lstm import GATES, LSTM
from layers.params import index, view

#: handler op of each gate's nonlinearity
_GATE_OP = {"i": "sigmoid", "f": "sigmoid", "g": "tanh", "o": "sigmoid"}


class UnfusedLSTM(LSTM):
    """:class:`layers.LSTM` computed one contract op at a time (see above)."""

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
        """The fused layer's buffers and views (:meth:`layers.LSTM._bufs`),
        plus what the unfused steps use besides: each gate's whole-sequence
        matrix ``A2[k]`` and two (B, H) temporaries."""
        b = super()._bufs(T, B)
        if not hasattr(b, "A2"):
            h, H = self.h, self.n_hidden
            b.A2 = [view(h, b.A, k * T * B * H, (T * B, H)) for k in range(4)]
            b.dh, b.tmp, b.dY_seq = h.allocate((B, H)), h.allocate((B, H)), None
        return b

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
