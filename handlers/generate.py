"""Write out the generated source: ``python -m handlers.generate``.

The contract's op methods are made from the op table (``handlers.optable``)
and kept as ordinary Python in ``handlers/generated_ops.py`` (and
PyCudaHandler's one-call forms in ``handlers/cuda/generated_one_call.py``),
so that an editor, a traceback and ``inspect.getsource`` see them.  The
kernels' launch constants (``handlers/cuda/kernels/launch_constants.cuh``)
are written from ``handlers/cuda/launch.py`` the same way.  Run this after
changing the table or those constants; ``tests/test_optable.py`` fails while
a file is out of date.
"""
from handlers import optable
from handlers.cuda import launch, one_call

#: (path, function that gives its text) of every generated file
FILES = ((optable.GENERATED, optable.generated_source),
         (one_call.GENERATED, one_call.generated_source),
         (launch.HEADER, launch.header_source))


def main():
    """Write every generated file whose text differs from what its source
    gives; print their paths."""
    for path, source in FILES:
        text = source()
        try:
            with open(path) as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
