"""The op table (``handlers.optable``) against what it describes.

* Every kernel's argument format in the table matches the kernel's signature
  in its ``.cu`` source (the sources preprocessed with the host C++ compiler,
  so the ``SH_*`` macros are expanded), for all four instantiations; in the
  half formats' a scalar must be of the compute type (the host passes a
  float), never the 2-byte storage type.
* Every kernel the sources export is in the table, so none is loaded by hand.
* The contract's elementwise methods are the table's: signature, docstring,
  and a handler missing a backend hook fails when it is made.
"""
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from handlers import Handler, NumpyHandler
from handlers.optable import ELEMENTWISE, KERNELS, OPS, PUBLIC, kernel_format

SOURCES = Path(__file__).resolve().parents[1] / "handlers" / "cuda" / "kernels"
CXX = shutil.which("g++") or shutil.which("clang++")
EXPORT = re.compile(r'extern\s+"C"\s+void\s+(\w+)_(f32|f64|bf16|f16)\s*\(([^)]*)\)')
#: each instantiation's storage type; the compute type C is float but for f64
STORAGE = {"f32": "float", "f64": "double", "bf16": "__nv_bfloat16", "f16": "__half"}
SUFFIXES = tuple(STORAGE)


def _code(param, suffix):
    """The launch format code of one C parameter of instantiation ``suffix``:
    "T" for a scalar of the format's compute type (the host's "T"), "!" for a
    scalar of a half storage type (the host would pass 4 bytes for 2)."""
    if "*" in param:
        return "P"
    ctype = " ".join(param.replace("const", "").split()[:-1])   # drop the name
    if ctype == "C" or (ctype in ("T", STORAGE[suffix]) and suffix in ("f32", "f64")):
        return "T"
    if ctype in ("T", STORAGE[suffix]):
        return "!"
    return {"long long": "q", "unsigned long long": "Q", "int": "i", "float": "f",
            "double": "d"}[ctype]


#: kernel name -> its C parameter list, as exported() last read it
PARAMETERS = {}


def exported():
    """kernel name -> {dtype suffix: format} as the .cu sources declare them
    (and each kernel's C parameters into PARAMETERS)."""
    found = {}
    for src in sorted(SOURCES.glob("*.cu")):
        # SH_HOST_PREPROCESS: common.cuh leaves out CUDA's headers, which a
        # machine without the toolkit does not have (only macros matter here).
        cmd = [CXX, "-E", "-P", "-x", "c++", "-std=c++17", "-D__global__=", "-D__device__=",
               "-D__forceinline__=", "-D__launch_bounds__(...)=", "-DSH_HOST_PREPROCESS",
               "-I", str(SOURCES), str(src)]
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        # Inside namespace sh_<suffix> the kernels are written in terms of T and C.
        for name, suffix, params in EXPORT.findall(text):
            fmt = "".join(_code(p.strip(), suffix) for p in params.split(",") if p.strip())
            found.setdefault(name, {})[suffix] = (src.stem, fmt)
            PARAMETERS[name] = [p.strip() for p in params.split(",") if p.strip()]
    return found


@pytest.fixture(scope="module")
def sources():
    if CXX is None:
        pytest.skip("no C++ compiler (g++ or clang++) to preprocess the kernel sources")
    return exported()


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernel_format_matches_its_source(sources, kernel):
    file, fmt = KERNELS[kernel]
    assert kernel in sources, f"{kernel} is not exported by any .cu source"
    for suffix in SUFFIXES:
        assert sources[kernel].get(suffix) == (file, fmt), (
            f"{kernel}_{suffix}: table says {file}.cu {fmt}, source has "
            f"{sources[kernel].get(suffix)}")


def test_elementwise_kernels_write_only_the_outputs(sources):
    """An elementwise kernel's pointers, in the row's order, are ``const``
    exactly where the row does not write the array: a kernel that swaps an
    input and the output fails here, not on a GPU."""
    for op in ELEMENTWISE.values():
        pointers = [p for p in PARAMETERS[op.kernel] if "*" in p]
        arrays = [p for p in op.params if p in op.arrays]
        want = ["const" if a not in op.writes else "written" for a in arrays]
        got = ["const" if p.startswith("const") else "written" for p in pointers]
        assert got == want, f"{op.name} ({op.kernel}): arrays {arrays} should be {want}, " \
                            f"the kernel's pointers are {pointers}"


def test_every_exported_kernel_is_in_the_table(sources):
    assert set(sources) == set(KERNELS)


def test_elementwise_formats_follow_the_parameters():
    assert kernel_format(OPS["clip_t"], "T") == "PTTPq"
    assert kernel_format(OPS["fill_if"], "T") == "PTPq"
    assert kernel_format(OPS["axpby"], "T") == "TPTPq"
    for op in ELEMENTWISE.values():
        assert KERNELS[op.kernel] == ("elementwise", kernel_format(op, "T")), op.name


def test_table_covers_the_contract():
    public = {n for n, v in vars(Handler).items() if callable(v) and not n.startswith("_")}
    assert set(OPS) == public


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_method_is_the_row(name):
    op = ELEMENTWISE[name]
    method = getattr(Handler, name)
    assert tuple(inspect.signature(method).parameters)[1:] == op.params
    assert op.doc in method.__doc__ and "Aliasing" in method.__doc__
    assert set(op.reads + op.unused + op.writes) | set(op.scalars) == set(op.params)


@pytest.mark.parametrize("name", sorted(set(PUBLIC) - set(ELEMENTWISE)))
def test_array_op_method_is_the_row(name):
    # Products, reductions, broadcasts, indexing, randomness: made from the
    # row like the elementwise ops, flags defaulting to False.
    op = PUBLIC[name]
    params = inspect.signature(getattr(Handler, name)).parameters
    assert tuple(params)[1:] == op.params
    assert all(params[f].default is False for f in op.flags)
    assert inspect.getdoc(getattr(Handler, name)) == inspect.cleandoc(op.doc)
    assert op.call and op.shape in ("same", "any") or callable(op.shape), name


def test_a_handler_missing_a_hook_fails_when_made():
    class Partial(NumpyHandler):
        pass
    del_hook = "_elementwise"
    Partial._elementwise = Handler._elementwise      # back to the abstract one
    Partial.__abstractmethods__ = frozenset({del_hook})
    with pytest.raises(TypeError, match=del_hook):
        Partial()

    class Bare(Handler):
        array_type = np.ndarray
    with pytest.raises(TypeError, match="abstract"):
        Bare()


# ============================================================================ generated source
def test_generated_files_are_up_to_date():
    """handlers/generated_ops.py and handlers/cuda/generated_one_call.py are
    what the table gives, and handlers/cuda/kernels/launch_constants.cuh what
    handlers/cuda/launch.py gives: after a change to either, run
    ``python -m handlers.generate``."""
    from handlers.generate import FILES
    for path, source in FILES:
        with open(path) as f:
            assert f.read() == source(), (f"{path} is out of date: run python -m "
                                          f"handlers.generate")


def test_op_methods_have_source_and_lines():
    """The ops are ordinary functions in a file: their source can be read,
    and a traceback names the file and the line that raised."""
    import traceback

    src = inspect.getsource(NumpyHandler.sum_t)
    assert src.startswith("def sum_t(self, a, axis, out") and "self._sum_t(" in src
    h = NumpyHandler()
    try:
        h.add_tt(h.zeros((2,)), h.zeros((3,)), h.zeros((2,)))
    except ValueError as e:
        frames = traceback.extract_tb(e.__traceback__)
    else:
        raise AssertionError("add_tt took arrays of two shapes")
    mine = [f for f in frames if f.filename.endswith("generated_ops.py")]
    assert mine and mine[0].name == "add_tt" and "check_same_shape" in mine[0].line


def test_a_row_missing_from_the_generated_file_still_works(monkeypatch):
    """A row added to the table before the file is written again gets its
    method built in memory, with a warning that says what to run."""
    import warnings

    from handlers import base, generated_ops
    monkeypatch.delattr(generated_ops, "add_tt")

    class Probe:
        pass
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        base.install_ops(Probe)
    assert any("python -m handlers.generate" in str(w.message) for w in seen)
    assert Probe.add_tt.__code__.co_filename == "<optable add_tt>"
