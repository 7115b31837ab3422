"""docs/adding_an_op.rst, followed step by step, so that the document stays true.

The page says that adding an elementwise op takes three edits and one
command: an ``ew(...)`` row in ``handlers/optable.py``, a functor and an
export line in ``handlers/cuda/kernels/elementwise.cu``, the op's float64
reference (and edge values) in ``tests/test_ops.py``, then ``python -m
handlers.generate``.  Here a throwaway op, ``cube_t`` (out = a * a * a), is
added that way to a copy of the repository's files, each line placed
next to the line of the page's own example (the change that added
``square_t``), and the copy's tests are run:

* before the command, ``import handlers`` warns to run it, the new method is
  built in memory, and ``test_generated_files_are_up_to_date`` fails;
* the command writes the two files the page names;
* after it, the tests the page says are derived from the row (validation,
  DebugHandler's recipes, the kernel's signature in the ``.cu`` source, the
  method against its row) run for ``cube_t`` and pass, with the coverage
  checks of the table and of the generated files, and ``inspect.getsource``
  reads the new method;
* a kernel whose signature does not follow the row fails the signature check.

Nothing here compiles CUDA: the kernel-signature check preprocesses the
``.cu`` sources with the host C++ compiler, which is all this needs.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding_an_op.rst"
#: the pseudo-file of the page's diff that the command writes
GENERATED = ("handlers/generated_ops.py", "handlers/cuda/generated_one_call.py")

#: cube_t's counterpart of each hunk of the page's square_t change, per file,
#: in the page's order: each is inserted right after the lines of its hunk.
CUBE = {
    "handlers/optable.py": [
        '    ew("cube_t", "a out=", "unary_cube",\n'
        "       lambda h, a, out: np.multiply(np.multiply(a, a), a, out=out),\n"
        '       "out = a * a * a."),\n'],
    "handlers/cuda/kernels/elementwise.cu": [
        "template <typename T> struct Cube { __device__ T operator()(T x) const "
        "{ return x * x * x; } };\n",
        "SH_UNARY(unary_cube, Cube)\n"],
    "tests/test_ops.py": ['    "cube_t": (lambda x: x ** 3, (-3, 3)),\n'],
}
#: step 3's "documented edge values": a row of test_ops.SPECIAL, after square_t's
SPECIAL_ANCHOR = '    ("square_t", ['
SPECIAL_CUBE = '    ("cube_t", [-2.0, 0.0, np.nan, -np.inf], [-8.0, 0.0, np.nan, -np.inf]),\n'

#: tests that must have run (and passed) for the new op: (test, text in its id)
MUST_RUN = [
    ("tests/test_ops.py::test_unary", "cube_t"),
    ("tests/test_ops.py::test_unary_special_values", "cube_t"),
    ("tests/test_optable.py::test_elementwise_method_is_the_row", "cube_t"),
    ("tests/test_optable.py::test_kernel_format_matches_its_source", "unary_cube"),
    ("tests/test_optable.py::test_every_exported_kernel_is_in_the_table", ""),
    ("tests/test_optable.py::test_elementwise_formats_follow_the_parameters", ""),
    ("tests/test_optable.py::test_generated_files_are_up_to_date", ""),
    ("tests/test_validation.py::test_bad_input", "cube_t"),
    ("tests/test_validation.py::test_valid_call", "cube_t"),
    ("tests/test_validation.py::test_every_op_has_bad_input_cases", ""),
    ("tests/test_debug_handler.py::test_op_gives_the_plain_result", "cube_t"),
    ("tests/test_debug_handler.py::test_bad_input_raises_like_the_handler", "cube_t"),
    ("tests/test_debug_handler.py::test_every_op_has_a_recipe", ""),
]
# All of test_optable.py ("table" is in its file name), the new op's cases
# elsewhere, and the other files' whole-table checks; a few seconds.
SELECT = "cube_t or unary_cube or table or generated or every or covers"
TEST_FILES = ["tests/test_optable.py", "tests/test_ops.py", "tests/test_validation.py",
              "tests/test_debug_handler.py"]

#: Run in the copy before and after the command: which handlers is imported,
#: whether the new method came from the generated file, and that it computes.
PROBE = """
import inspect
import numpy as np
import handlers, handlers.testing
from handlers import DebugHandler, NumpyHandler
print("handlers:", handlers.__file__)
print("testing:", handlers.testing.__file__)
print("method file:", NumpyHandler.cube_t.__code__.co_filename)
h = NumpyHandler(np.float64)
a = h.create_from_numpy(np.array([-3.0, 0.5, 2.0]))
h.cube_t(a, a)
assert h.get_numpy_copy(a).tolist() == [-27.0, 0.125, 8.0]
d = DebugHandler(NumpyHandler(np.float64))
b = d.create_from_numpy(np.array([-1.0, 3.0]))
d.cube_t(b, b)
assert d.get_numpy_copy(b).tolist() == [-1.0, 27.0]
try:
    source = inspect.getsource(NumpyHandler.cube_t)
except (OSError, TypeError) as e:
    source = f"no source: {e}"
print("source:", source.splitlines()[0])
"""


def doc_change():
    """The page's square_t change: {file: [hunk, ...]}, a hunk being the
    consecutive added lines (a "..." line in the diff separates hunks)."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"added ``square_t``:\n\n\.\. code-block:: diff\n\n((?: {3}.*\n|\n)+)",
                      text)
    assert block, f"{DOC.name}: no diff block after 'the whole change that added square_t'"
    change, hunks = {}, None
    for line in block.group(1).splitlines():
        line = line[3:]
        if line.startswith("--- "):
            # "--- tests/test_ops.py (UNARY)": the note in parentheses is not the path
            hunks = change.setdefault(line[4:].split(" (")[0], [])
            hunks.append([])
        elif line.startswith("+"):
            hunks[-1].append(line[1:] + "\n")
        elif hunks is not None and hunks[-1]:
            hunks.append([])      # "..." (or anything else) ends the hunk
    return {path: [h for h in hunks if h] for path, hunks in change.items()}


def insert_after(path, hunk, new_text):
    """Put ``new_text`` right after the lines ``hunk``, which occur once in ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = [i for i in range(len(lines)) if lines[i:i + len(hunk)] == hunk]
    assert len(at) == 1, f"{path.name}: the page's lines {hunk} occur {len(at)} times"
    lines.insert(at[0] + len(hunk), new_text)
    path.write_text("".join(lines), encoding="utf-8")


def copy_repository(dest):
    """The repository's files as they are in the work tree, into ``dest``:
    the tracked ones, and new ones not yet added (a module just written),
    but nothing git ignores (build outputs, the compiled extension)."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():        # a tracked file deleted in the work tree is left out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run(copy, *args):
    """``python *args`` in the copy, whose ``handlers`` comes first on the path
    (ahead of the editable install's finder, which sits after sys.path's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(copy), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=240)


def pytest_in(copy, *args):
    return run(copy, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args)


def test_the_pages_change_is_in_the_repository():
    """The page's square_t lines are the repository's, in the files it names,
    and its last entry names the two generated files."""
    change = doc_change()
    assert set(change) == {*CUBE, ", ".join(GENERATED)}, sorted(change)
    for name, hunks in change.items():
        if name in CUBE:
            text = (ROOT / name).read_text(encoding="utf-8")
            for hunk in hunks:
                assert "".join(hunk) in text, f"{name} lacks the page's lines {hunk}"
            assert len(hunks) == len(CUBE[name]), (name, hunks)


@pytest.mark.timeout(300)
def test_adding_an_op_by_the_page(tmp_path):
    copy = tmp_path / "repo"
    copy_repository(copy)

    # Steps 1-3: each cube_t line next to the page's square_t lines.
    for name, hunks in doc_change().items():
        for hunk, new_text in zip(hunks, CUBE.get(name, ())):
            insert_after(copy / name, hunk, new_text)
    ops_py = copy / "tests" / "test_ops.py"
    anchor = [line for line in ops_py.read_text(encoding="utf-8").splitlines(keepends=True)
              if line.startswith(SPECIAL_ANCHOR)]
    assert len(anchor) == 1, "test_ops.py: square_t's row of SPECIAL"
    insert_after(ops_py, anchor, SPECIAL_CUBE)

    # Before step 4: the method is built in memory with a warning naming the
    # command, and the generated-file test fails.
    before = run(copy, "-c", PROBE)
    assert before.returncode == 0, before.stdout + before.stderr
    assert f"handlers: {copy / 'handlers' / '__init__.py'}" in before.stdout, before.stdout
    assert f"testing: {copy / 'handlers' / 'testing.py'}" in before.stdout, before.stdout
    assert "method file: <optable cube_t>" in before.stdout, before.stdout
    assert "cube_t" in before.stderr and "python -m handlers.generate" in before.stderr, (
        before.stderr)
    stale = pytest_in(copy, "tests/test_optable.py::test_generated_files_are_up_to_date")
    assert stale.returncode == 1 and "1 failed" in stale.stdout, stale.stdout[-3000:]
    assert "out of date: run python -m handlers.generate" in stale.stdout, stale.stdout[-3000:]

    # Step 4: the command writes the two files the page names, and no more.
    generate = run(copy, "-m", "handlers.generate")
    assert generate.returncode == 0, generate.stdout + generate.stderr
    written = sorted(Path(line.removeprefix("wrote ")).relative_to(copy).as_posix()
                     for line in generate.stdout.splitlines())
    assert written == sorted(GENERATED), generate.stdout
    for name in GENERATED:   # PyCudaHandler's one-call form too
        assert "def cube_t(self, a, out):" in (copy / name).read_text(encoding="utf-8"), name

    # After it: no warning, the method is the generated file's with its source.
    after = run(copy, "-c", PROBE)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "python -m handlers.generate" not in after.stderr, after.stderr
    assert f"method file: {copy / 'handlers' / 'generated_ops.py'}" in after.stdout, after.stdout
    assert "source: def cube_t(self, a, out):" in after.stdout, after.stdout

    # The copy's tests: the new op's cases, the table and generated-file checks.
    result = pytest_in(copy, "-rA", "-k", SELECT, *TEST_FILES)
    tail = result.stdout[-6000:]
    assert result.returncode == 0, tail
    passed = [line.split(" ", 1)[1] for line in result.stdout.splitlines()
              if line.startswith("PASSED ")]
    for test, mark in MUST_RUN:
        assert any(p.split("[")[0] == test and mark in p for p in passed), (
            f"{test} did not pass for {mark or 'the table'}:\n{tail}")

    # "A kernel whose parameters do not follow the row's ... fails there": one
    # that takes a scalar the row does not have.
    cu = copy / "handlers" / "cuda" / "kernels" / "elementwise.cu"
    cu.write_text(cu.read_text(encoding="utf-8").replace(
        "SH_UNARY(unary_cube, Cube)\n",
        "SH_EXPORT(unary_cube, (const T* a, C s, T* out, long long n),\n"
        "          sh::map<false>(sh::Cube<C>{}, out, n, a))\n"), encoding="utf-8")
    wrong = pytest_in(copy, "tests/test_optable.py", "-k", "unary_cube")
    assert wrong.returncode == 1 and "1 failed" in wrong.stdout, wrong.stdout[-3000:]
    assert "FAILED tests/test_optable.py::test_kernel_format_matches_its_source[unary_cube]" in (
        wrong.stdout), wrong.stdout[-3000:]
