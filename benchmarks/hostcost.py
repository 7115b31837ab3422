"""``python -m benchmarks hostcost``: where an op's host time goes.

For the small ops of the overhead table (1,000 elements, 16x16 gemm), prints
the median host microseconds of: the whole op; the op with its kernel launch
replaced by a no-op (validation and dispatch, in C on the one-call path of
``handlers.cuda.one_call``, which then records its launch instead); the launch alone
through pycuda with pre-packed arguments; and, as floors, a raw
``cuLaunchKernel`` through ctypes and through ``cuda.bindings``, and the event
record/wait calls that stream-group fork and join use.  A diagnostic for
choosing what to make leaner, not a target.
"""
import ctypes
import struct

import numpy as np

from benchmarks.common import suite_parser
from benchmarks.gpu import cuda_handler, host_overhead_us
from benchmarks.ops import small_ops

F32 = np.float32


def _floors(h, calls):
    """Raw launch and event costs under the handler's own op."""
    import pycuda.driver as drv
    from pycuda.compiler import compile as nvcc_compile
    out = {}
    x = h.create_from_numpy(np.zeros(1000, F32))
    src = ('extern "C" __global__ void nop(float* p, long long n)'
           '{ if (threadIdx.x == 0 && n < 0) p[0] = 0; }')
    cubin = nvcc_compile(src, no_extern_c=True)
    mod = drv.module_from_buffer(cubin)
    fn = mod.get_function("nop")
    fn.prepare("Pq")
    stream = h.stream
    # pycuda's own calls, measured for comparison, take pycuda's Stream.
    pstream, psync = drv.Stream(flags=1), drv.Context.synchronize
    args = struct.pack("Pq", int(x.gpudata), 1000)
    out["pycuda _launch_kernel, packed"] = host_overhead_us(
        lambda: fn._launch_kernel((4, 1), (256, 1, 1), args, 0, pstream), calls,
        sync=psync)
    out["pycuda prepared_async_call"] = host_overhead_us(
        lambda: fn.prepared_async_call((4, 1), (256, 1, 1), pstream, x.gpudata, 1000), calls,
        sync=psync)

    # The kernel's parameters for the raw launches, built once: each entry of
    # params points at one argument's value.
    ptr, n = ctypes.c_void_p(int(x.gpudata)), ctypes.c_longlong(1000)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(n))

    cuda = ctypes.CDLL("libcuda.so.1")
    cmod, cfn = ctypes.c_void_p(), ctypes.c_void_p()
    buf = ctypes.create_string_buffer(cubin, len(cubin))
    if cuda.cuModuleLoadData(ctypes.byref(cmod), buf) == 0 and \
            cuda.cuModuleGetFunction(ctypes.byref(cfn), cmod, b"nop") == 0:
        launch = cuda.cuLaunchKernel
        launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        launch.restype = ctypes.c_int
        hstream = ctypes.c_void_p(stream.handle)
        f = cfn.value

        def raw():
            return launch(f, 4, 1, 1, 256, 1, 1, 0, hstream, params, None)
        rc = raw()
        if rc == 0:
            out["ctypes cuLaunchKernel"] = host_overhead_us(raw, calls,
                                                            sync=h.synchronize_all_streams)
        else:
            print(f"hostcost: ctypes floor skipped: cuLaunchKernel returned {rc}")
        try:
            from handlers.cuda import _launch
        except ImportError:
            print("hostcost: handlers.cuda._launch not built; C launcher floor skipped")
        else:
            if _launch.load():
                ptr_int, sh = int(x.gpudata), stream.handle
                out["handlers.cuda._launch.launch"] = host_overhead_us(
                    lambda: _launch.launch(f, sh, 4, 256, b"Pq", ptr_int, 1000), calls,
                    sync=h.synchronize_all_streams)
                gd = x.gpudata
                out["handlers.cuda._launch.launch, gpudata"] = host_overhead_us(
                    lambda: _launch.launch(f, sh, 4, 256, b"Pq", gd, 1000), calls,
                    sync=h.synchronize_all_streams)
    try:
        from cuda.bindings import driver as cbd

        def check(what, result):
            """The values after a cuda.bindings call's CUresult; raise if it failed."""
            err, *values = result
            if err != cbd.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{what}: {err!r}")
            return values[0] if len(values) == 1 else values
        bmod = check("cuModuleLoadData", cbd.cuModuleLoadData(cubin))
        bfn = check("cuModuleGetFunction", cbd.cuModuleGetFunction(bmod, b"nop"))
        bstream = cbd.CUstream(stream.handle)
        kargs = ((int(x.gpudata), 1000), (ctypes.c_void_p, ctypes.c_longlong))
        check("cuLaunchKernel",
              cbd.cuLaunchKernel(bfn, 4, 1, 1, 256, 1, 1, 0, bstream, kargs, 0))
        out["cuda.bindings cuLaunchKernel"] = host_overhead_us(
            lambda: cbd.cuLaunchKernel(bfn, 4, 1, 1, 256, 1, 1, 0, bstream, kargs, 0), calls,
            sync=h.synchronize_all_streams)
        # kernelParams as a raw address: no per-call argument conversion.
        addr = ctypes.addressof(params)
        bfn_int, bstream_int = int(bfn), int(bstream)
        out["cuda.bindings, address params"] = host_overhead_us(
            lambda: cbd.cuLaunchKernel(bfn, 4, 1, 1, 256, 1, 1, 0, bstream, addr, 0), calls,
            sync=h.synchronize_all_streams)
        out["cuda.bindings, int handles"] = host_overhead_us(
            lambda: cbd.cuLaunchKernel(bfn_int, 4, 1, 1, 256, 1, 1, 0, bstream_int, addr, 0),
            calls, sync=h.synchronize_all_streams)

        def set_and_launch():
            ptr.value = int(x.gpudata)
            n.value = 1000
            cbd.cuLaunchKernel(bfn, 4, 1, 1, 256, 1, 1, 0, bstream, addr, 0)
        out["cuda.bindings, set 2 args + launch"] = host_overhead_us(
            set_and_launch, calls, sync=h.synchronize_all_streams)
    except Exception as e:  # optional floor
        print(f"hostcost: cuda.bindings floor skipped: {e!r}")
    out["struct.pack('Pq', int(gpudata), n)"] = host_overhead_us(
        lambda: struct.pack("Pq", int(x.gpudata), 1000), calls)
    from pycuda._pvt_struct import pack
    out["pycuda pack('Pq', gpudata, n)"] = host_overhead_us(
        lambda: pack("Pq", x.gpudata, 1000), calls)
    out["int(a.gpudata)"] = host_overhead_us(lambda: int(x.gpudata), calls)

    out.update(_gemm_floors(h, calls))
    ev = drv.Event(flags=drv.event_flags.DISABLE_TIMING)
    other = drv.Stream(flags=1)
    out["event record"] = host_overhead_us(lambda: ev.record(pstream), calls, sync=psync)
    out["stream wait_for_event"] = host_overhead_us(lambda: other.wait_for_event(ev), calls,
                                                    sync=psync)
    v1 = h.with_streams(1)
    out["view.wait_for(handler)"] = host_overhead_us(lambda: v1.wait_for(h), calls,
                                                     sync=h.synchronize_all_streams)
    out["with_streams(1) lookup"] = host_overhead_us(lambda: h.with_streams(1), calls)
    sides = [h.with_streams(k) for k in range(1, 4)]

    def fork():
        ev = h.record_event()
        for v in sides:
            v.wait_event(ev)
    out["fork: record_event + 3 wait_event"] = host_overhead_us(fork, calls,
                                                                sync=h.synchronize_all_streams)
    return out


def _lt_floor(h, pa, pc, calls):
    """A 16x16 cublasLtMatmul with descriptors and algorithm chosen once: the
    floor of a GEMM path that caches cuBLAS's per-call heuristic."""
    from nvmath.bindings import cublas
    from nvmath.bindings import cublasLt as lt
    handle = lt.create()
    desc = lt.matmul_desc_create(int(cublas.ComputeType.COMPUTE_32F), 0)   # scale CUDA_R_32F
    op = np.zeros(1, np.int32)                                             # CUBLAS_OP_N
    for attr in (lt.MatmulDescAttribute.TRANSA, lt.MatmulDescAttribute.TRANSB):
        lt.matmul_desc_set_attribute(desc, int(attr), op.ctypes.data, 4)
    lay = lt.matrix_layout_create(0, 16, 16, 16)                           # CUDA_R_32F
    pref = lt.matmul_preference_create()
    ws = np.zeros(1, np.uint64)
    lt.matmul_preference_set_attribute(
        pref, int(lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES), ws.ctypes.data, 8)
    results = np.zeros(512, np.uint8)   # cublasLtMatmulHeuristicResult_t (96 bytes) and room
    count = np.zeros(1, np.int32)
    lt.matmul_algo_get_heuristic(handle, desc, lay, lay, lay, lay, pref, 1,
                                 results.ctypes.data, count.ctypes.data)
    if count[0] < 1:
        raise RuntimeError("cublasLt: no algorithm for a 16x16 sgemm")
    scal = np.array([1.0, 0.0], np.float32)
    pal, pbe, algo = scal.ctypes.data, scal.ctypes.data + 4, results.ctypes.data
    sh = h.stream.handle
    try:
        return host_overhead_us(
            lambda: lt.matmul(handle, desc, pal, pa, lay, pa, lay, pbe, pc, lay, pc, lay, algo,
                              0, 0, sh), calls, sync=h.synchronize_all_streams)
    finally:
        h.synchronize_all_streams()
        lt.matmul_preference_destroy(pref)
        lt.matrix_layout_destroy(lay)
        lt.matmul_desc_destroy(desc)
        lt.destroy(handle)


def _torch_device_us(torch, fn, calls=400):
    """``device_us`` for a PyTorch call on its current stream."""
    big = torch.zeros((4096, 4096), device="cuda")
    out = torch.empty_like(big)
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    for _ in range(3):
        torch.mm(big, big, out=out)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def _gemm_floors(h, calls):
    """Bare 16x16 sgemm calls on the handler's stream through each binding."""
    out = {}
    a = h.create_from_numpy(np.ones((16, 16), F32))
    c = h.zeros((16, 16))
    pa, pc = int(a.gpudata), int(c.gpudata)
    sync = h.synchronize_all_streams
    try:
        from handlers.cuda.blas import _SkcudaGemm
        g = _SkcudaGemm(np.dtype(F32), h.stream)
        # The same symbol through ctypes, as scikit-cuda's wrapper would call it.
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        pal, pbe = ctypes.byref(alpha), ctypes.byref(beta)
        out["cublasSgemm ctypes"] = host_overhead_us(
            lambda: g._fn(g.handle, 0, 0, 16, 16, 16, pal, pa, 16, pa, 16, pbe, pc, 16),
            calls, sync=sync)
        try:
            from handlers.cuda import _launch
            out["cublasSgemm handlers.cuda._launch.gemm"] = host_overhead_us(
                lambda: _launch.gemm(g._symbol, g.handle, 0, 0, 16, 16, 16, 1.0, pa, 16, pa, 16,
                                     0.0, pc, 16, False), calls, sync=sync)
        except ImportError:
            pass
        g.close()
    except ImportError as e:
        print(f"hostcost: scikit-cuda floors skipped: {e}")
    try:
        from handlers.cuda.blas import _NvmathGemm
        g = _NvmathGemm(np.dtype(F32), h.stream)
        g._scalars[:] = (1.0, 0.0)
        out["cublasSgemm nvmath"] = host_overhead_us(
            lambda: g._fn(g.handle, 0, 0, 16, 16, 16, g._palpha, pa, 16, pa, 16, g._pbeta, pc,
                          16), calls, sync=sync)
        g.close()
        out["cublasLtMatmul nvmath, algo cached"] = _lt_floor(h, pa, pc, calls)
    except ImportError as e:
        print(f"hostcost: nvmath floor skipped: {e}")
    try:
        import torch
        ta = torch.ones((16, 16), device="cuda")
        tc = torch.empty((16, 16), device="cuda")
        out["torch.mm(out=) 16x16"] = host_overhead_us(lambda: torch.mm(ta, ta, out=tc), calls,
                                                       sync=torch.cuda.synchronize)
        tx = torch.ones(1000, device="cuda")
        ty = torch.ones(1000, device="cuda")
        out["torch.add(out=) 1000"] = host_overhead_us(lambda: torch.add(tx, ty, out=ty), calls,
                                                       sync=torch.cuda.synchronize)
        ts = torch.zeros((), device="cuda")
        out["torch.sum(out=) 1000"] = host_overhead_us(lambda: torch.sum(tx, 0, out=ts), calls,
                                                       sync=torch.cuda.synchronize)
        for name, fn in (("add", lambda: torch.add(tx, ty, out=ty)),
                         ("sum", lambda: torch.sum(tx, 0, out=ts)),
                         ("mm 16x16", lambda: torch.mm(ta, ta, out=tc))):
            out[f"torch {name}: GPU us per call, host ahead"] = _torch_device_us(torch, fn)
    except ImportError:
        pass
    return out


def device_us(h, fn, big, out, calls=400):
    """GPU microseconds per ``fn()`` call, with the host kept ahead: the calls
    are queued behind ~8 ms of large gemms, so the events between them time
    the device alone (``big`` and ``out``: 4096x4096 arrays for those gemms).
    When this is close to the host time per call, a host measurement of
    back-to-back calls is bounded by the device."""
    from handlers.cuda import kernel_loader
    ext = kernel_loader.require()
    for _ in range(20):
        fn()
    start, end = ext.timing_event_new(), ext.timing_event_new()
    h.synchronize_all_streams()
    for _ in range(3):
        h.dot_mm(big, big, out)
    ext.record(start, h.stream.handle)
    for _ in range(calls):
        fn()
    ext.record(end, h.stream.handle)
    ext.event_sync(end)
    ms = ext.event_elapsed(start, end)
    ext.event_free(start)
    ext.event_free(end)
    return ms * 1000.0 / calls


def main(argv=None):
    parser = suite_parser("hostcost", __doc__, save=False)
    parser.add_argument("--calls", type=int, default=10000)
    args = parser.parse_args(argv)
    h = cuda_handler("hostcost", F32, what="tool")
    if h is None:
        return 0
    calls = args.calls
    ops = small_ops(h, np.random.default_rng(0))
    sync = h.synchronize_all_streams
    whole = {k: host_overhead_us(f, calls, sync=sync) for k, f in ops.items()}
    # The same ops with every launch (kernel and gemm) replaced by a no-op; the
    # one-call path (handlers.cuda.one_call) swapped for a dry one, which checks
    # and records its launch instead of making it.
    from handlers.cuda import handler as pycuda_handler
    from handlers.cuda import one_call
    launch, gemm, fast = pycuda_handler._launch_kernel, h._gemm, h._one_call
    pycuda_handler._launch_kernel = lambda *a: None
    h._one_call = one_call.make(h, h._slot, h._gemm, pycuda_handler._BLOCK, dry=True)
    h._gemm = lambda *a: None   # the ops run on h itself: group 0
    try:
        checks = {k: host_overhead_us(f, calls) for k, f in ops.items()}
    finally:
        pycuda_handler._launch_kernel = launch
        h._one_call, h._gemm = fast, gemm
    big, out = h.zeros((4096, 4096)), h.zeros((4096, 4096))
    device = {k: device_us(h, f, big, out) for k, f in ops.items()}
    print(f"Host us per call, median of {calls} calls; kernel launcher: handlers.cuda._launch; "
          f"device: GPU us per call with the host ahead")
    print(f"{'op':16} {'whole':>8} {'checks':>8} {'launch':>8} {'device':>8}")
    for k in ops:
        print(f"{k:16} {whole[k]:8.2f} {checks[k]:8.2f} {whole[k] - checks[k]:8.2f} "
              f"{device[k]:8.2f}")
    print("\nfloors:")
    for k, v in _floors(h, calls).items():
        print(f"  {k:34} {v:6.2f}")
    return 0
