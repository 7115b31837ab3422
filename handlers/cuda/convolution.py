"""Convolution (cuDNN) and pooling (``kernels/pool.cu``) on PyCudaHandler.

Three parts:

- the cuDNN engine policy: which numerical notes rule an engine out
  (``refused_notes``), the engines denied whatever their notes
  (``DENIED_ENGINES``), the workspace limit and how many candidates a plan
  times;
- planning without a handler: the dimensions cuDNN is given for a call
  (``conv_dims``: which array plays x, w and y in each pass, the stride
  clamp), the ``conv_engines`` list and its inverse, and a pooling launch
  (``pool_launch``, an immutable ``PoolLaunch``);
- the runners, functions of the handler assigned in its class body
  (``_conv2d = convolution.conv2d``, ``_pool2d = convolution.pool2d``).
  Pooling kernels launch through ``h._run``; convolutions through cuDNN,
  loaded into the ``handlers.cuda._launch`` extension by ``load_cudnn``.
"""
import functools
import math
import os
from typing import NamedTuple

from .. import toolkit
from ..base import Handler
from . import context as cuda_context
from . import graph as cuda_graph
from . import kernel_loader
from .launch import BLOCK

_cudnn = None    # the extension, once load_cudnn has loaded cuDNN into it

# A convolution algorithm needing more workspace than this is passed over for
# the next one the heuristics rank (or the small-workspace fallback).
WORKSPACE_LIMIT = 1 << 30
# How many of the engines cuDNN ranks for a convolution its first call times
# (plan_conv): on an H200 the fastest accurate engine was at most fifth of
# the allowed ones.
CANDIDATES = 6
# cuDNN's numerical notes (cudnnBackendNumericalNote_t, each a bit of the
# masks _cudnn takes and returns); refused_notes says which rule an engine out.
CUDNN_NOTES = ("tensor_core", "down_convert_inputs", "reduced_precision_reduction", "fft",
               "nondeterministic", "winograd", "winograd_tile_4x4", "winograd_tile_6x6",
               "winograd_tile_13x13", "strict_nan_prop")


def note_mask(*names):
    """The mask of the numerical notes ``names`` (CUDNN_NOTES)."""
    return sum(1 << CUDNN_NOTES.index(n) for n in names)


def refused_notes(backward, half, deterministic):
    """The mask of cuDNN numerical notes a convolution engine must not carry.

    Every format: no down-converted inputs and no reduced-precision sums (the
    contract computes in the format, or in float32 for the halves).  Float32
    and float64: no tensor cores (that would be TF32).  The halves: tensor
    cores are theirs (the inputs are half already, the sums float32), but no
    FFT or Winograd engines, whose transforms round to the half format.
    Backward passes: no atomics unless ``deterministic`` is off (float32 and
    float64 only)."""
    refused = note_mask("down_convert_inputs", "reduced_precision_reduction")
    if half:
        refused |= note_mask("fft", "winograd", "winograd_tile_4x4", "winograd_tile_6x6",
                             "winograd_tile_13x13")
    else:
        refused |= note_mask("tensor_core")
    if backward and (deterministic or half):
        refused |= note_mask("nondeterministic")
    return refused


# Engines (global indices, per pass: 0 forward, 1 backward data, 2 backward
# filter) never chosen, whatever their notes say, because they measured far
# less accurate than their notes allow.  Backward-filter engine 17 (cuDNN 9 on
# an H200, November 2026; PyTorch picks it too): at a LeNet layer (x
# 64x1x28x28, dy 64x6x24x24: sums of 36864 products) its float32 gradient
# was off by up to 0.22 (391 units of 2^-24 times the sum of the products'
# magnitudes; float32 BLAS: 0.1), TF32-like, with no tensor-core note; in
# bfloat16, 2.2 times the tolerance tests/helpers.py derives from the format.
# Read at each plan (a diagnostic replaces it: benchmarks/results/diagnostics/
# conv_engines.py).
DENIED_ENGINES = {0: (), 1: (), 2: (17,), 3: (), 4: ()}


def cudnn_note_names(mask):
    """The names of the numerical notes in ``mask`` (reports and errors)."""
    return [n for i, n in enumerate(CUDNN_NOTES) if mask >> i & 1]


def cudnn_paths():
    """Where cuDNN 9 is looked for, in order: the ``lib/`` of the
    ``nvidia.cudnn`` package (the ``nvidia-cudnn-cu*`` wheels) if importable,
    then the plain soname ``libcudnn.so.9`` on the loader's path."""
    return toolkit.wheel_library_paths("cudnn", "libcudnn.so.9")


def load_cudnn():
    """The extension with cuDNN 9 loaded from the first of ``cudnn_paths``
    that opens; ImportError naming what was tried if none does."""
    global _cudnn
    if _cudnn is None:
        ext = kernel_loader.require()
        errors = []
        for path in cudnn_paths():
            if os.path.sep in path and not os.path.exists(path):
                errors.append(f"{path}: no such file")
                continue
            try:
                ext.cudnn_load(path)
                break
            except RuntimeError as e:
                errors.append(str(e))
        else:
            raise ImportError("PyCudaHandler: the conv2d ops need cuDNN 9 (pip install "
                              "nvidia-cudnn-cu13, or nvidia-cudnn-cu12 for CUDA 12, or a system "
                              "libcudnn9); tried the nvidia.cudnn "
                              "package and the soname libcudnn.so.9: " + "; ".join(errors))
        _cudnn = ext
    return _cudnn


# planning (no handler) ------------------------------------------------------------
#: the cuDNN pass of each conv2d kind (the number _cudnn takes)
CONV_KINDS = {"forward": 0, "backward_data": 1, "backward_filter": 2}
#: conv2d_bias_act's activations that cuDNN runs in the convolution's graph,
#: and their plans' numbers (a forward pass with pointwise operations after)
FUSED_KINDS = {None: 3, "relu": 4}
#: a plan cache's entry for a fused forward cuDNN has no engine for: the
#: op falls back (``conv2d_bias_act``)
NO_PLAN = (0, 0, None, 0)


def conv_pass(code):
    """The pass (``CONV_KINDS``' number) plan ``code`` runs: a fused
    forward's is the forward's."""
    return code if code in (1, 2) else 0


def conv_dims(code, a_shape, b_shape, out_shape, stride, padding, dilation):
    """The dimensions cuDNN plans pass ``code`` with, for arrays (a, b, out)
    of these shapes: x's four, w's K, R and S, y's P and Q, the two strides,
    the padding and the dilation."""
    # (x, w, y) shapes: (a, b, out) forward, (out, b, a) backward data,
    # (a, out, b) backward filter.
    x, w, y = ((a_shape, b_shape, out_shape), (out_shape, b_shape, a_shape),
               (a_shape, out_shape, b_shape))[conv_pass(code)]
    # A stride past the padded input changes nothing (one output row)
    # but could overflow cuDNN's int: clamp it.
    sh = min(stride[0], x[2] + 2 * padding[0])
    sw = min(stride[1], x[3] + 2 * padding[1])
    return (*x, w[0], w[2], w[3], y[2], y[3], sh, sw, *padding, *dilation)


def engines(plans):
    """``conv_engines()`` of the plan cache ``plans``: ``[pass, format, x,
    w, y, stride, padding, dilation, engine]`` per convolution, as plain
    values (the key's fields but its alignment, then the plan's engine)."""
    return [[key[0], key[1], *(list(k) for k in key[2:-1]), plan[2]]
            for key, plan in list(plans.items()) if plan is not NO_PLAN]


def engine_pins(engines):
    """The pins (plan key without its alignment -> engine) a ``conv_engines()``
    list asks for; ValueError for a list that is not one."""
    pins = {}
    try:
        for e in engines:
            code, fmt, *shapes, engine = e
            key = (int(code), int(fmt), *(tuple(int(v) for v in s) for s in shapes))
            if len(key) != 8:
                raise ValueError(f"{len(key)} fields")
            pins[key] = int(engine)
    except (TypeError, ValueError) as err:
        raise ValueError(f"prefer_conv_engines: expected a list from conv_engines(), "
                         f"got {engines!r:.200} ({err})") from None
    return pins


#: the pooling kernels' mode of each pool2d kind
POOL_MODES = {"max": 0, "avg": 1, "max_backward": 0, "avg_backward": 1}


class PoolLaunch(NamedTuple):
    """One pooling launch: the kernel (a name of ``h._k``), its grid of
    BLOCK-thread blocks, whether it is a backward pass (whose arrays are
    src, argmax, dst; forward: src, dst, argmax) and the integer arguments
    after the arrays."""

    kernel: str
    grid: int
    backward: bool
    ints: tuple


@functools.lru_cache(maxsize=1024)   # pure; asked at every call of the op
def pool_launch(kind, src_shape, dst_shape, window, stride, padding, max_blocks):
    """The ``PoolLaunch`` of pool2d ``kind`` from an array of ``src_shape``
    into one of ``dst_shape`` (NCHW), on a grid of at most ``max_blocks``."""
    backward = kind.endswith("backward")
    big, small = (dst_shape, src_shape) if backward else (src_shape, dst_shape)
    n, c, height, width = big
    p, q = small[2:]
    # A stride past the padded input changes nothing (P or Q is then 1)
    # but would not fit the kernel's int.
    sh = min(stride[0], height + 2 * padding[0])
    sw = min(stride[1], width + 2 * padding[1])
    grid = max(1, min(-(-math.prod(dst_shape) // BLOCK), max_blocks))
    return PoolLaunch("pool_bwd" if backward else "pool_fwd", grid, backward,
                      (n * c, height, width, p, q, *window, sh, sw, *padding, POOL_MODES[kind]))


# runners (functions of the handler) ---------------------------------------------
def conv2d(h, kind, a, b, out, stride, padding, dilation):
    """``_conv2d``: run one pass on cuDNN (``run_conv``)."""
    run_conv(h, CONV_KINDS[kind], (a, b, out), stride, padding, dilation)


def conv2d_bias_act(h, x, w, bias, out, stride, padding, dilation, act):
    """``_conv2d_bias_act``: the convolution, bias and activation as one
    cuDNN graph where ``act`` is one cuDNN runs there (``FUSED_KINDS``) and
    cuDNN offers an engine the policy allows; else the convolution and
    then the epilogue as fused ops (``Handler._conv2d_bias_act``)."""
    code = FUSED_KINDS.get(act, -1)
    if code < 0 or not run_conv(h, code, (x, w, out, bias), stride, padding, dilation):
        Handler._conv2d_bias_act(h, x, w, bias, out, stride, padding, dilation, act)


def run_conv(h, code, arrays, stride, padding, dilation):
    """Run plan ``code`` (``CONV_KINDS``, ``FUSED_KINDS``) on ``arrays``
    (a, b, out[, bias]), planned at the first call of its geometry
    (``plan_conv``) and kept in ``h._conv_plans``; False, running nothing,
    for a fused plan cuDNN has no engine for."""
    cuda_context.enter()
    slot = h._slot
    handle = slot.cudnn or cudnn_handles(h)
    a, b, out = arrays[:3]
    pointers = [int(arr.gpudata) for arr in arrays]
    # the largest power of two up to 16 that divides every address: cuDNN
    # engines may rely on the alignment a plan declares
    bits = 16
    for p in pointers:
        bits |= p
    align = bits & -bits
    key = (code, h._format, a.shape, b.shape, out.shape, stride, padding, dilation, align)
    plan = h._conv_plans.get(key)
    if plan is None:
        dims = conv_dims(code, a.shape, b.shape, out.shape, stride, padding, dilation)
        plan = h._conv_plans[key] = plan_conv(h, code, align, dims, arrays, handle,
                                              h._conv_pins.get(key[:-1]))
    if plan is NO_PLAN:
        return False
    ptr, nbytes = plan[:2]
    ws = int(slot.cudnn_workspace(nbytes)) if nbytes else 0
    _cudnn.cudnn_conv_run(ptr, handle, *pointers[:3], ws, *pointers[3:])
    return True


def plan_conv(h, code, align, dims, arrays, handle, pin=None):
    """(plan, workspace bytes, engine, its notes) of one convolution.

    The candidates: cuDNN's engines that the policy allows
    (refused_notes, DENIED_ENGINES), in its heuristics' order, up to
    CANDIDATES.  Each runs on this call's arrays (twice to warm up,
    then three times between events) and the fastest is kept; the others
    are freed.  Timing, because the heuristics rank some accurate engines
    behind far slower ones: with engine 17 denied, backward filter of a
    3x3x64 ResNet layer (batch 64, 56x56, float32) fell to engine 1 at
    1.28 ms, where FFT engine 18, ranked last, took 0.54 ms with a
    smaller error (an H200, November 2026).  Inside a capture nothing can
    be timed: the heuristics' first pick is kept.  Either way the plan
    lasts for the handler's life and its twins share it, so captured and
    eager steps run the same engines.  Engines compiled at runtime
    (seconds at first use) are a last resort: only when no other engine
    qualifies, and then the first alone.  ``pin``: an engine to take
    without timing where it is among the candidates (the engine another
    process chose: ``prefer_conv_engines``).  ``arrays``: (a, b, out[,
    bias]), run while timing.  A fused forward (``FUSED_KINDS``) with no
    engine gives ``NO_PLAN``; any other pass raises RuntimeError."""
    slot = h._slot
    refused = refused_notes(conv_pass(code) != 0, h._half, h.deterministic)
    pointers = [int(arr.gpudata) for arr in arrays]
    denied, found = list(DENIED_ENGINES[code]), []

    def plan(rtc):
        return _cudnn.cudnn_conv_plan(handle, code, h._format, WORKSPACE_LIMIT,
                                      align, refused, tuple(denied), int(rtc), *dims)
    timed = not cuda_graph.is_capturing(slot.handle)
    while len(found) < (CANDIDATES if timed or pin is not None else 1):
        got = plan(rtc=False) or (None if found else plan(rtc=True))
        if got is None:
            break
        ptr, engine, notes, nbytes = got
        found.append((ptr, nbytes, engine, notes))
        denied.append(engine)
        if engine == pin:
            break
    pinned = [cand for cand in found if pin is not None and cand[2] == pin]
    if not found and code in FUSED_KINDS.values():
        return NO_PLAN
    if not found:
        raise RuntimeError(
            f"PyCudaHandler: cuDNN offers no engine for this convolution (pass {code}, "
            f"format {h.dtype.name}) within {WORKSPACE_LIMIT} bytes of workspace "
            f"that is free of the numerical notes {cudnn_note_names(refused)} and not "
            f"one of the engines {list(DENIED_ENGINES[code])}")
    best = pinned[0] if pinned else found[0]
    try:
        if len(found) > 1 and timed and not pinned:
            times = []
            ext = kernel_loader.require()
            events = []
            try:
                events.append(ext.timing_event_new())
                events.append(ext.timing_event_new())
                start, end = events
                for ptr, nbytes, _, _ in found:
                    ws = int(slot.cudnn_workspace(nbytes)) if nbytes else 0
                    for k in range(5):
                        if k == 2:
                            ext.record(start, slot.handle)
                        _cudnn.cudnn_conv_run(ptr, handle, *pointers[:3], ws, *pointers[3:])
                    ext.record(end, slot.handle)
                    ext.event_sync(end)
                    times.append(ext.event_elapsed(start, end))
            finally:
                for event in events:
                    ext.event_free(event)
            best = found[times.index(min(times))]
    except BaseException:
        for cand in found:
            _cudnn.cudnn_plan_free(cand[0])
        raise
    for cand in found:
        if cand is not best:
            _cudnn.cudnn_plan_free(cand[0])
    return best


def cudnn_handles(h):
    """Load cuDNN and make every stream's handle (once, so that the first
    convolution, rather than one inside a later capture, makes them);
    return the handle of ``h``'s group."""
    if h._resources.slots is None:
        raise RuntimeError("PyCudaHandler: the handler is closed")
    ext = load_cudnn()
    for s in h._all_slots:
        if not s.cudnn:
            s.cudnn = ext.cudnn_create(s.handle)
    return h._slot.cudnn


def pool2d(h, kind, src, dst, argmax, window, stride, padding):
    """``_pool2d``: one pooling pass (``pool_launch``) through ``h._run``."""
    launch = pool_launch(kind, src.shape, dst.shape, window, stride, padding, h._max_blocks)
    am = 0 if argmax is None else argmax.gpudata
    arrays = ((src.gpudata, am, dst.gpudata) if launch.backward
              else (src.gpudata, dst.gpudata, am))
    h._run(h._k[launch.kernel], launch.grid, *arrays, *launch.ints)
