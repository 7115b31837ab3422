"""attention_forward and attention_backward per handler, against
scaled dot-product attention written out in float64 NumPy on the inputs as
the handler holds them: causal and not, as many keys as queries or not,
the default and a given scale, every output, and a captured call equal to
an eager one.  The float64 reference is itself checked against central
differences once."""
import numpy as np
import pytest

from handlers import NumpyHandler
from helpers import assert_unchanged, poisoned, upload

#: these ops run on the float16 and bfloat16 NumpyHandler too (conftest)
HALF_FORMATS = True

# (B, H, T, S, D): one of everything, odd sizes, more keys than queries and
# fewer; then head sizes of 64 and 32 over several tiles of 64 rows, none a
# multiple of it (the GPU's fused kernels for the halves take these)
SHAPES = [(1, 1, 1, 1, 1), (2, 3, 5, 5, 4), (1, 2, 7, 11, 8), (2, 1, 9, 4, 3), (1, 4, 33, 33, 16),
          (2, 2, 70, 70, 64), (1, 3, 5, 130, 32), (1, 2, 130, 40, 64)]
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 1e-2, "bfloat16": 6e-2}


def reference(q, k, v, dout, causal, scale):
    """out, lse, dq, dk, dv in float64."""
    z = scale * q @ np.swapaxes(k, -1, -2)
    t, s = z.shape[-2:]
    if causal:
        z = np.where(np.arange(s)[None, :] > np.arange(t)[:, None], -np.inf, z)
    m = z.max(-1, keepdims=True)
    e = np.exp(z - m)
    total = e.sum(-1, keepdims=True)
    p = e / total
    out, lse = p @ v, (m + np.log(total))[..., 0]
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    return (out, lse, scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q,
            np.swapaxes(p, -1, -2) @ dout)


def _inputs(handler, rng, shape):
    b, h, t, s, d = shape
    host = [rng.uniform(-1, 1, sh) for sh in ((b, h, t, d), (b, h, s, d), (b, h, s, d),
                                               (b, h, t, d))]
    pairs = [upload(handler, x) for x in host]
    return [a for a, _ in pairs], [x for _, x in pairs]


def _close(handler, got, want, what):
    tol = TOL[handler.dtype.name]
    got = handler.get_numpy_copy(got).astype(np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= tol, f"{what}: normwise error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_against_float64(handler, rng, shape, causal):
    (q, k, v, dout), host = _inputs(handler, rng, shape)
    scale = None if shape[-1] != 4 else 0.3
    want = reference(*host, causal, 0.3 if scale else 1 / np.sqrt(shape[-1]))
    b, h, t, s, d = shape
    out, lse = poisoned(handler, (b, h, t, d)), poisoned(handler, (b, h, t))
    assert handler.attention_forward(q, k, v, out, lse, causal=causal, scale=scale) is None
    dq, dk, dv = (poisoned(handler, x.shape) for x in (q, k, v))
    handler.attention_backward(q, k, v, out, lse, dout, dq, dk, dv, causal=causal, scale=scale)
    for name, got, w in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), want):
        _close(handler, got, w, name)
    for name, a, x in zip("qkv", (q, k, v), host):
        assert_unchanged(handler, a, x, name)


@pytest.mark.parametrize("d", [4, 64])
def test_causal_rows_ignore_later_keys(handler, rng, d):
    """Under the mask, query t's output does not change with keys or values
    after t."""
    (q, k, v, _), host = _inputs(handler, rng, (1, 2, 6, 6, d))
    outs = []
    for bump in (False, True):
        kk, vv = host[1].copy(), host[2].copy()
        if bump:
            kk[..., 3:, :] += 5.0
            vv[..., 3:, :] -= 7.0
        out, lse = handler.zeros((1, 2, 6, d)), handler.zeros((1, 2, 6))
        handler.attention_forward(q, upload(handler, kk)[0], upload(handler, vv)[0], out, lse,
                                  causal=True)
        outs.append(handler.get_numpy_copy(out))
    np.testing.assert_array_equal(outs[0][..., :3, :], outs[1][..., :3, :])
    assert not np.array_equal(outs[0][..., 3:, :], outs[1][..., 3:, :])


@pytest.mark.parametrize("shape", [(2, 2, 8, 8, 4), (1, 2, 70, 70, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_a_captured_call_equals_an_eager_one(handler, rng, shape):
    (q, k, v, dout), _ = _inputs(handler, rng, shape)
    b, h, t, _, d = shape
    results = []
    for captured in (False, True):
        out, lse = handler.zeros((b, h, t, d)), handler.zeros((b, h, t))
        dq, dk, dv = handler.zeros(q.shape), handler.zeros(k.shape), handler.zeros(v.shape)

        def step():
            handler.attention_forward(q, k, v, out, lse, causal=True)
            handler.attention_backward(q, k, v, out, lse, dout, dq, dk, dv, causal=True)
        step()   # eager first: the scratch memory is allocated outside the capture
        if captured:
            for a in (out, lse, dq, dk, dv):
                handler.fill(a, 0.0)
            with handler.capture() as graph:
                step()
            graph.replay()
        results.append([handler.get_numpy_copy(a) for a in (out, lse, dq, dk, dv)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_the_reference_is_the_derivative(rng):
    """The float64 reference's gradients against central differences of
    L = sum(R * out)."""
    q, k, v = (rng.uniform(-1, 1, (1, 2, 4, 3)), rng.uniform(-1, 1, (1, 2, 5, 3)),
               rng.uniform(-1, 1, (1, 2, 5, 3)))
    r = rng.standard_normal((1, 2, 4, 3))
    for causal in (False, True):
        _, _, dq, dk, dv = reference(q, k, v, r, causal, 0.7)
        for x, g in ((q, dq), (k, dk), (v, dv)):
            num = np.zeros_like(x)
            for i in np.ndindex(x.shape):
                old = x[i]
                x[i] = old + 1e-6
                plus = (r * reference(q, k, v, r, causal, 0.7)[0]).sum()
                x[i] = old - 1e-6
                minus = (r * reference(q, k, v, r, causal, 0.7)[0]).sum()
                x[i] = old
                num[i] = (plus - minus) / 2e-6
            np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


def test_scratch_follows_the_shape():
    """Calls of several shapes, in any order, on one handler."""
    h = NumpyHandler(np.float64)
    rng = np.random.default_rng(1)
    for shape in [(1, 1, 3, 3, 2), (2, 2, 4, 6, 2), (1, 1, 3, 3, 2)]:
        (q, k, v, dout), host = _inputs(h, rng, shape)
        out, lse = h.zeros(q.shape), h.zeros(q.shape[:3])
        h.attention_forward(q, k, v, out, lse)
        np.testing.assert_allclose(h.get_numpy_copy(out),
                                   reference(*host, False, 1 / np.sqrt(shape[-1]))[0],
                                   rtol=1e-12)
