"""State dicts and checkpoint files.

A *state dict* is a flat mapping from stable, readable names to NumPy arrays
and plain values (int, float, str, bool, None, and lists and dicts of them),
as PyTorch users know it: ``net.state_dict()`` names each parameter by its
layer's position and class and its own name (``"1.FullyConnected.W"``), an
optimizer's adds its buffers per parameter (``"velocity.1.FullyConnected.W"``)
and its hyperparameters (``"lr"``), and a ``Trainer``'s gathers them all under
prefixes (``"net."``, ``"optimizer."``, ``"loss_scaler."``, ``"trainer."``).

Files are safetensors (the ``safetensors`` package): the arrays are its
tensors and the plain values travel as one JSON document in its header
metadata, under the key ``"streamhandlers"``.  ``save`` is atomic: it writes a
temporary file beside the target, flushes it to disk and renames it over the
target, so a crash or a kill during a save leaves the previous file whole.

``load_state_dict`` everywhere checks before it writes: the names, shapes and
dtypes of the whole state, raising ``ValueError`` that names the first
mismatch and leaving every array as it was.  The checks live here, in
``ArrayChecker``, so that each owner only says what it expects.
"""
import json
import os
import tempfile
from collections.abc import Mapping

import numpy as np

from handlers import dtypes

#: The header metadata key under which the plain values are stored.
METADATA_KEY = "streamhandlers"
#: Bumped when the meaning of a saved name changes.
FORMAT_VERSION = 1


def save(path, state):
    """Write the state dict ``state`` to the safetensors file ``path``,
    atomically: a temporary file in the same folder, flushed to disk
    (``fsync``), then renamed over ``path``; the folder is flushed too.  A
    crash or a kill at any point leaves either the previous file or the new
    one, never a torn one.  TypeError for a value that is neither an array
    nor a plain (JSON) value."""
    from safetensors.numpy import save_file

    arrays, plain = {}, {}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[name] = np.ascontiguousarray(value)
        else:
            plain[name] = value
    try:
        text = json.dumps({"version": FORMAT_VERSION, "values": plain})
    except TypeError as e:
        raise TypeError(f"checkpoint.save: every value must be a NumPy array or a plain "
                        f"value (int, float, str, bool, None, list, dict): {e}") from None
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        # written straight from the arrays (no copy of the whole file in memory)
        save_file(arrays, tmp, metadata={METADATA_KEY: text})
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _fsync_folder(folder):
    """Flush the rename to disk (where the system lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(path):
    """The state dict in the safetensors file ``path``: its tensors as NumPy
    arrays (bfloat16 as ``ml_dtypes.bfloat16``) and the plain values of its
    header.  A file that other tools wrote (no ``streamhandlers`` metadata)
    gives its tensors only.  ValueError for a file that is not safetensors."""
    from safetensors import SafetensorError, deserialize, safe_open

    path = os.fspath(path)
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            names = list(f.keys())
            # bfloat16, which safetensors' NumPy reader lacks, is read below
            odd = {n for n in names if f.get_slice(n).get_dtype() not in _NUMPY_READS}
            state = {n: None if n in odd else f.get_tensor(n) for n in names}
        if odd:
            with open(path, "rb") as f:
                views = dict(deserialize(f.read()))
            state.update({n: _array(n, views[n]) for n in odd})
    except SafetensorError as e:
        raise ValueError(f"checkpoint.load: {path} is not a safetensors file: {e}") from None
    if METADATA_KEY in meta:
        doc = json.loads(meta[METADATA_KEY])
        if doc.get("version", 0) > FORMAT_VERSION:
            raise ValueError(f"checkpoint.load: {path} was written by a newer streamhandlers "
                             f"(format {doc['version']}, this one reads {FORMAT_VERSION})")
        state.update(doc.get("values", {}))
    return state


#: the tensor formats safetensors' NumPy reader returns itself
_NUMPY_READS = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8",
                "BOOL"}


def _array(name, view):
    """One deserialized tensor that safetensors' NumPy reader does not return
    (bfloat16, the one other format this library reads), as a writable array."""
    if view["dtype"] != "BF16":
        raise ValueError(f"checkpoint.load: tensor {name!r} has dtype {view['dtype']}, which "
                         f"this library does not read")
    dt = dtypes.resolve("bfloat16")
    return np.frombuffer(view["data"], dtype=dt).reshape(view["shape"]).copy()


def subset(state, prefix):
    """The entries of ``state`` whose names start with ``prefix``, without it."""
    n = len(prefix)
    return {k[n:]: v for k, v in state.items() if k.startswith(prefix)}


def prefixed(prefix, state):
    """``state`` with ``prefix`` put before every name."""
    return {prefix + k: v for k, v in state.items()}


def widens_exactly(src, dst):
    """True where every value of dtype ``src`` is exact in ``dst`` (the same
    format, or a wider float: bfloat16 or float16 into float32, float32
    into float64)."""
    src, dst = np.dtype(src).name, np.dtype(dst).name
    order = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}   # the two halves: neither
    return src == dst or (src in order and dst in order and order[src] < order[dst])


class ArrayChecker:
    """Checks a state dict against what its owner expects, collecting the
    values to write only once everything holds.

    ``owner`` names the caller in errors (``"Sequential.load_state_dict"``).
    ``cast`` allows arrays of a format that does not convert exactly (a
    float32 state into a bfloat16 network rounds); without it only the
    same format or an exact widening is accepted.
    """

    def __init__(self, owner, state, cast=False):
        if not isinstance(state, Mapping):
            raise TypeError(f"{owner}: expected a state dict (a mapping of names to arrays "
                            f"and values), got {type(state).__name__}")
        self.owner, self.state, self.cast = owner, state, cast
        self.seen = set()

    def array(self, name, shape, dtype):
        """The array ``name``, checked to have ``shape`` and a dtype that
        converts to ``dtype``, returned in ``dtype``."""
        a = self._get(name)
        if not isinstance(a, np.ndarray):
            raise ValueError(f"{self.owner}: {name!r} must be an array, got "
                             f"{type(a).__name__}")
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{self.owner}: {name!r} has shape {tuple(a.shape)} in the "
                             f"state but {tuple(shape)} here")
        if a.dtype.kind not in "f" and not dtypes.is_half(a.dtype):
            raise ValueError(f"{self.owner}: {name!r} must hold floats, got {a.dtype}")
        if not self.cast and not widens_exactly(a.dtype, dtype):
            raise ValueError(f"{self.owner}: {name!r} is {a.dtype} in the state but "
                             f"{np.dtype(dtype)} here, which would round it; pass "
                             f"cast=True to round")
        return a

    def value(self, name, kind=None):
        """The plain value ``name`` (checked to be an instance of ``kind``)."""
        v = self._get(name)
        if kind is not None and (not isinstance(v, kind) or isinstance(v, bool)
                                 and kind is not bool):
            raise ValueError(f"{self.owner}: {name!r} must be {_kind_name(kind)}, got "
                             f"{type(v).__name__} {v!r}")
        return v

    def _get(self, name):
        if name not in self.state:
            raise ValueError(f"{self.owner}: the state has no {name!r}")
        self.seen.add(name)
        return self.state[name]

    def done(self):
        """ValueError naming the first entry of the state nobody asked for
        (a state of another model, say)."""
        extra = [k for k in self.state if k not in self.seen]
        if extra:
            raise ValueError(f"{self.owner}: the state has {len(extra)} unexpected "
                             f"entr{'y' if len(extra) == 1 else 'ies'}, the first "
                             f"{extra[0]!r}: it is of another model or object")


def _kind_name(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


class NoCopies:
    """Refuses ``pickle``, ``copy.copy`` and ``copy.deepcopy``: an object
    whose arrays are views into buffers it shares (a network's layers view
    its flat parameter buffer) would come out of a copy linked to nothing,
    training without learning.  The error says what to do instead."""

    def __reduce_ex__(self, protocol):
        raise TypeError(
            f"{type(self).__name__} cannot be pickled or copied: its arrays are views of "
            f"buffers on its handler. Save its state instead: state = obj.state_dict() "
            f"(or layers.checkpoint.save(path, state)), build a new one the same way, then "
            f"new.load_state_dict(state)")
