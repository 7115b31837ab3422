"""The package's structure: no module imports another that imports it back,
directly or around a circle, counting imports inside functions too (a lazy
import hides a circle from Python, not from a reader)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path, name):
    """The project modules ``path`` (module ``name``) imports, anywhere in it."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_no_import_cycle():
    files = [p for d in ("handlers", "layers") for p in (ROOT / d).rglob("*.py")]
    names = {module_name(p): p for p in files}
    # a package's __init__ re-exports its modules: an edge into a package
    # is not a cycle through it, so packages are left out of the graph
    packages = {n for n, p in names.items() if p.name == "__init__.py"}
    graph = {n: {m for m in imports(p, n) if m in names and m != n and m not in packages}
             for n, p in names.items() if n not in packages}
    cycles, done = [], set()

    def visit(n, stack):
        if n in stack:
            cycles.append(stack[stack.index(n):] + [n])
            return
        if n in done:
            return
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            visit(m, stack)
        stack.pop()
        done.add(n)
    for n in sorted(graph):
        visit(n, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


NO_EXEC = """
import builtins, sys
ours = []
real_exec, real_compile = builtins.exec, builtins.compile
def spy(real):
    def call(*args, **kwargs):
        where = sys._getframe(1).f_code.co_filename
        if where.startswith(ROOT):
            ours.append(where)
        return real(*args, **kwargs)
    return call
builtins.exec, builtins.compile = spy(real_exec), spy(real_compile)
import handlers, handlers.cuda.handler, layers, layers.lstm, layers.trainer  # noqa: E401
builtins.exec, builtins.compile = real_exec, real_compile
print(len(ours), sorted(set(ours)))
"""


def test_nothing_is_exec_ed_at_import():
    # the package's methods are checked-in source (handlers/generated_ops.py),
    # and a fused op declared at import makes its method at first use
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", f"ROOT = {str(ROOT)!r}\n" + NO_EXEC],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split(" ", 1)[0] == "0", out
