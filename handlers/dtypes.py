"""The dtypes a handler may hold, and the facts about them that code decides on.

Four formats: ``float32`` and ``float64``, and two half-width ones, ``float16``
(IEEE binary16) and ``bfloat16`` (float32's exponent with an 8-bit
significand).  On the host, bfloat16 is ``ml_dtypes.bfloat16``, the NumPy
extension type the ecosystem shares; it is imported only when asked for, so
the other formats need no extra package.

Half formats are storage formats: an op computes in float32 and rounds once
when it stores a result, and a reduction accumulates in float32
(:func:`compute_dtype`).  Everything here is the single place for those facts;
handlers and tests ask, rather than compare dtypes themselves.
"""
import functools

import numpy as np

FLOAT32, FLOAT64, FLOAT16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)

#: What each name accepted by :func:`resolve` means (besides NumPy's own names).
_ALIASES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "f16": "float16",
            "fp16": "float16", "half": "float16", "float32": "float32", "f32": "float32",
            "float64": "float64", "f64": "float64"}


def bfloat16():
    """NumPy's dtype of ``ml_dtypes.bfloat16``; ImportError, saying how to
    install it, if the package is missing."""
    try:
        import ml_dtypes
    except ImportError as e:
        raise ImportError("bfloat16 arrays need the ml_dtypes package "
                          "(pip install ml_dtypes)") from e
    return np.dtype(ml_dtypes.bfloat16)


def _is_bfloat16(dt):
    # Compared by name, so that asking never imports ml_dtypes; the size
    # first, as NumPy builds a dtype's name at each read.
    return dt.itemsize == 2 and dt.name == "bfloat16"


def resolve(dtype):
    """``dtype`` as a ``numpy.dtype`` if it is one of the four formats
    (NumPy types and dtypes, ``ml_dtypes.bfloat16``, or a name such as
    ``"bfloat16"``); TypeError naming them otherwise."""
    if isinstance(dtype, str) and dtype.lower() in _ALIASES:
        name = _ALIASES[dtype.lower()]
        return bfloat16() if name == "bfloat16" else np.dtype(name)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is not None and (dt in (FLOAT32, FLOAT64, FLOAT16) or _is_bfloat16(dt)):
        return dt
    raise TypeError(f"dtype must be float32, float64, float16 or bfloat16, got {dtype!r}")


def is_real(dtype):
    """True for host arrays a handler converts from: booleans, integers and
    floats, bfloat16 included (NumPy files it under kind ``V``)."""
    dt = np.dtype(dtype)
    return dt.kind in "fiub" or _is_bfloat16(dt)


def is_half(dtype):
    """True for float16 and bfloat16."""
    dt = np.dtype(dtype)
    return dt == FLOAT16 or _is_bfloat16(dt)


def compute_dtype(dtype):
    """The dtype ops compute and accumulate in: float32 for the half formats,
    the dtype itself otherwise."""
    return FLOAT32 if is_half(dtype) else np.dtype(dtype)


def short_name(dtype):
    """``f16``, ``bf16``, ``f32`` or ``f64`` (kernel suffixes, test ids)."""
    dt = np.dtype(dtype)
    return "bf16" if _is_bfloat16(dt) else {FLOAT16: "f16", FLOAT32: "f32", FLOAT64: "f64"}[dt]


def significand_bits(dtype):
    """Bits of precision, the implicit one included: 11, 8, 24 or 53."""
    dt = np.dtype(dtype)
    return 8 if _is_bfloat16(dt) else {FLOAT16: 11, FLOAT32: 24, FLOAT64: 53}[dt]


def unit_roundoff(dtype):
    """Half the gap between 1 and the next number: the largest relative error
    of one rounding to nearest (2^-11 for float16, 2^-8 for bfloat16)."""
    return 2.0 ** -significand_bits(dtype)


@functools.cache   # asked by every index op's shape check
def exact_integers(dtype):
    """Whole numbers 0..N are all exact in ``dtype`` for this N (2^bits):
    the bound for indices that ops store as floats (argmax, pool argmax)."""
    return 2 ** significand_bits(dtype)


def largest(dtype):
    """The largest finite number of ``dtype``."""
    dt = np.dtype(dtype)
    if _is_bfloat16(dt):
        return float(np.array(0x7F7F, np.uint16).view(dt))
    return float(np.finfo(dt).max)


def _emin(dt):
    """The exponent of ``dt``'s smallest normal number."""
    return -126 if _is_bfloat16(dt) else {FLOAT16: -14, FLOAT32: -126, FLOAT64: -1022}[dt]


def smallest_normal(dtype):
    """The smallest positive normal number of ``dtype``: 2^-14 for float16,
    2^-126 for bfloat16 and float32, 2^-1022 for float64."""
    return 2.0 ** _emin(np.dtype(dtype))


def smallest_subnormal(dtype):
    """The smallest positive number of ``dtype`` (the spacing of its
    subnormals): 2^-24 for float16, 2^-133 for bfloat16."""
    dt = np.dtype(dtype)
    return 2.0 ** (_emin(dt) - (significand_bits(dt) - 1))
