"""Write out the generated source: ``python -m handlers.generate``.

The contract's op methods are made from the op table (``handlers.optable``)
and kept as ordinary Python in ``handlers/generated_ops.py`` (and
PyCudaHandler's one-call forms in ``handlers/cuda/generated_one_call.py``),
so that an editor, a traceback and ``inspect.getsource`` see them.  Run this after
changing the table; ``tests/test_optable.py`` fails while the file is out
of date.
"""
from handlers import optable
from handlers.cuda import one_call

#: (path, function that gives its text) of every generated file
FILES = ((optable.GENERATED, optable.generated_source),
         (one_call.GENERATED, one_call.generated_source))


def main():
    """Write every generated file from the table; print their paths."""
    for path, source in FILES:
        with open(path, "w") as f:
            f.write(source())
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
