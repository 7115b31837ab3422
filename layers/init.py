"""Seeded initializers: they fill *host* arrays from a NumPy generator.

``ParameterSet`` draws every initial value on the host from one generator and
uploads the whole flat buffer once, so the same seed gives the same starting
point on every handler.  Nothing here touches a handler.
"""
import numpy as np


def glorot_uniform(rng, out, fan_in, fan_out):
    """Fill ``out`` with U(-a, a), a = sqrt(6 / (fan_in + fan_out)) (Glorot and
    Bengio, 2010): keeps activations' variance about constant through layers."""
    a = np.sqrt(6.0 / (fan_in + fan_out))
    out[...] = rng.uniform(-a, a, out.shape)


def he_normal(rng, out, fan_in):
    """Fill ``out`` with N(0, 2 / fan_in) (He et al., 2015), for ReLU layers."""
    out[...] = rng.standard_normal(out.shape) * np.sqrt(2.0 / fan_in)


def orthogonal(rng, out, gain=1.0):
    """Fill the matrix ``out`` (rows, cols) with a random (semi-)orthogonal
    matrix: recurrent weights that neither shrink nor grow the state at first."""
    rows, cols = out.shape
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))      # make the distribution uniform (Haar)
    out[...] = gain * (q if rows >= cols else q.T)


def constant(out, value):
    """Fill ``out`` with ``value``."""
    out[...] = value
