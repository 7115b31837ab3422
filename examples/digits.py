"""An LSTM reads handwritten digits row by row and names them.

    python -m examples.digits [--handler auto|numpy|pycuda] [--epochs N] [--plot PATH]
                              [--save PATH]

The data set is the 8x8 digits that scikit-learn ships (1797 images,
``sklearn.datasets.load_digits``).  Each image is a sequence of 8 time steps
(its rows) of 8 features (the pixels of a row); a held-out test split, the
shuffling and the initial weights all come from one seed.  The model is an
LSTM whose last hidden state feeds a fully connected layer and a softmax
cross-entropy loss, trained with SGD and momentum.

Runs on PyCudaHandler where a GPU is present, else on NumpyHandler
(``--handler`` chooses explicitly).  Prints the handler, the time per epoch and
the test accuracy, writes the loss curve as a PNG, saves the trained model
(``net.save``, a safetensors file) and loads it back into the same network on
NumpyHandler in float64, whose test accuracy it prints beside the trained
one, and exits with status 1 if the test accuracy is below the target.
"""
import argparse
import sys
import time

import numpy as np

from handlers import NumpyHandler
from layers import LSTM, SGD, FullyConnected, Sequential, SoftmaxCrossEntropy, Trainer, accuracy

TARGET_ACCURACY = 0.95


def load_images(seed, test_fraction=0.2):
    """Return ((x_train, y_train), (x_test, y_test)): x the images (n, 8, 8),
    pixels scaled to [0, 1]; y the class indices as floats, shape (n, 1).  The
    split is stratified, so both parts have every digit in the data set's
    proportions (both demos use it)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float64) / 16.0        # (n, 8 rows, 8 pixels)
    labels = digits.target.astype(np.float64).reshape(-1, 1)
    x_tr, x_te, y_tr, y_te = train_test_split(images, labels, test_size=test_fraction,
                                              random_state=seed, stratify=digits.target)
    return (x_tr, y_tr), (x_te, y_te)


def load_data(seed, test_fraction=0.2):
    """``load_images`` with x time-major (8 steps, n, 8 features), what the
    LSTM reads."""
    (x_tr, y_tr), (x_te, y_te) = load_images(seed, test_fraction)

    def time_major(a):   # (n, T, F) -> (T, n, F)
        return np.ascontiguousarray(a.transpose(1, 0, 2))
    return (time_major(x_tr), y_tr), (time_major(x_te), y_te)


def demo_arguments(prog, doc, epochs, lr, plot, save):
    """The options both demos take (their defaults differ); the caller adds
    its own and parses."""
    p = argparse.ArgumentParser(prog=prog, description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--handler", choices=("auto", "numpy", "pycuda"), default="auto")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--float64", action="store_true", help="float64 instead of float32")
    p.add_argument("--precision", choices=("bf16", "fp16"), default=None,
                   help="mixed precision: compute in bfloat16 or float16 (with dynamic "
                        "loss scaling), float32 master weights")
    p.add_argument("--plot", default=plot, help=f"PNG of the loss curve (default {plot}; "
                                                "'' for none)")
    p.add_argument("--save", default=save, help=f"safetensors file for the trained model "
                                                f"(default {save}; '' for none)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (by default one is drawn on a terminal only)")
    return p


def make_handler(choice, dtype, seed):
    """The handler named by ``choice`` ("auto" prefers PyCudaHandler)."""
    if choice in ("auto", "pycuda"):
        try:
            from handlers import PyCudaHandler
            return PyCudaHandler(dtype=dtype, seed=seed)
        except (ImportError, RuntimeError) as exc:
            if choice == "pycuda":
                raise SystemExit(f"digits: PyCudaHandler is not usable here: "
                                 f"{type(exc).__name__}: {exc}")
            print(f"no usable GPU ({type(exc).__name__}: {exc}); using NumpyHandler")
    return NumpyHandler(dtype=dtype, seed=seed)


def build(h, hidden, seed):
    """The classifier: LSTM(8 -> hidden), last step -> FullyConnected(hidden -> 10)."""
    return Sequential(h, [LSTM(8, hidden, return_sequences=False),
                          FullyConnected(hidden, 10)],
                      SoftmaxCrossEntropy(), seed=seed)


def epoch_printer(trainer):
    """on_epoch(record) for ``Trainer.fit``: prints the epoch's losses, test
    accuracy and time (above the progress bar when there is one)."""
    def report(e):
        line = (f"epoch {e['epoch']:3d}  train loss {e['train_loss']:.4f}  "
                f"test loss {e['eval_loss']:.4f}  test accuracy {e['eval_accuracy']:.4f}  "
                f"{e['seconds']:.3f} s")
        if trainer.progress:
            try:
                from tqdm import tqdm
                tqdm.write(line)
                return
            except ImportError:
                pass
        print(line)
    return report


def save_and_reload(net, path, build_net, x_test, y_test, trained_accuracy):
    """Save ``net``'s parameters to ``path`` (``net.save``), load them into
    ``build_net(h)`` on NumpyHandler in float64 (``net.load``: float32
    parameters convert exactly), and print that network's test accuracy
    beside ``trained_accuracy`` (the same unless a few borderline images
    round the other way in float64).  Returns that accuracy."""
    net.save(path)
    print(f"saved the trained model: {path}")
    h = NumpyHandler(np.float64)
    served = build_net(h)
    served.load(path)
    outputs = h.get_numpy_copy(served.forward(h.create_from_numpy(x_test)))
    acc = accuracy(outputs, y_test)
    apart = round(abs(acc - trained_accuracy) * len(y_test))
    same = "the same" if apart == 0 else \
        f"{apart} of {len(y_test)} images apart: float64 rounds a few the other way"
    print(f"loaded into {type(h).__name__} (float64): test accuracy {acc:.4f} "
          f"(trained model {trained_accuracy:.4f}: {same})")
    return acc


def plot_losses(history, path, title):
    """Write the per-step and per-epoch training loss and the test loss as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(1, len(history.step_losses) + 1)
    per_epoch = len(history.step_losses) // max(1, len(history.epochs))
    ends = np.arange(1, len(history.epochs) + 1) * per_epoch
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, history.step_losses, lw=0.6, alpha=0.5, label="train loss (step)")
    ax.plot(ends, history.train_loss, "o-", ms=3, label="train loss (epoch mean)")
    if "eval_loss" in history.epochs[0]:
        ax.plot(ends, [e["eval_loss"] for e in history.epochs], "s-", ms=3, label="test loss")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = demo_arguments("python -m examples.digits", __doc__, 20, 0.2, "digits_loss.png",
                       "digits_model.safetensors")
    p.add_argument("--hidden", type=int, default=64)
    args = p.parse_args(argv)

    (x_tr, y_tr), (x_te, y_te) = load_data(args.seed)
    h = make_handler(args.handler, np.float64 if args.float64 else np.float32, args.seed)
    net = build(h, args.hidden, args.seed)
    opt = SGD(net.parameters, lr=args.lr, momentum=args.momentum)
    trainer = Trainer(net, opt, batch_size=args.batch_size, batch_axis=1, seed=args.seed,
                      progress=False if args.no_progress else None, metrics={"accuracy": accuracy},
                      precision=args.precision)
    print(f"handler: {h!r}" + (f", computing in {net.h.dtype} (mixed precision)"
                                if args.precision else ""))
    print(f"data: {x_tr.shape[1]} training and {x_te.shape[1]} test images as "
          f"{x_tr.shape[0]} steps x {x_tr.shape[2]} features; model: {net}, "
          f"{net.parameters.count} parameters")

    t0 = time.perf_counter()
    history = trainer.fit(x_tr, y_tr, args.epochs, eval_data=(x_te, y_te),
                          on_epoch=epoch_printer(trainer))
    total = time.perf_counter() - t0
    final = history.epochs[-1]
    per_epoch = np.mean([e["seconds"] for e in history.epochs])
    # The first epoch includes one-time costs (buffer allocation, kernel loading).
    steady = np.median([e["seconds"] for e in history.epochs])
    mixed = f", computing in {net.h.dtype.name}" if args.precision else ""
    print(f"handler: {type(h).__name__} ({h.dtype.name}{mixed})")
    print(f"time per epoch: {per_epoch:.3f} s mean, {steady:.3f} s median "
          f"({args.epochs} epochs, {total:.1f} s in all with evaluation)")
    compare_graphs(args, h, trainer, steady, x_tr, y_tr)
    ok = final["eval_accuracy"] >= TARGET_ACCURACY
    print(f"test accuracy: {final['eval_accuracy']:.4f} "
          f"(target >= {TARGET_ACCURACY}: {'met' if ok else 'MISSED'})")
    if args.save:
        save_and_reload(net, args.save, lambda h64: build(h64, args.hidden, args.seed),
                        x_te, y_te, final["eval_accuracy"])
    if args.plot:
        try:
            plot_losses(history, args.plot, f"LSTM on digits, {type(h).__name__}")
            print(f"loss curve: {args.plot}")
        except ImportError:
            print("matplotlib is not installed: no loss curve (pip install matplotlib)")
    return 0 if ok else 1


def compare_graphs(args, h, trainer, steady, x_tr, y_tr):
    """Train the same model again for 3 epochs the other way (captured if the
    trainer ran eagerly, and back) and print both times per epoch."""
    # the trainer captures by default where replays pay (PyCudaHandler)
    net2 = build(h, args.hidden, args.seed)
    other = Trainer(net2, SGD(net2.parameters, lr=args.lr, momentum=args.momentum),
                    batch_size=args.batch_size, batch_axis=1, seed=args.seed,
                    progress=False, graph=not trainer.graph, precision=args.precision)
    other_epoch = float(np.median([e["seconds"] for e in other.fit(x_tr, y_tr, 3).epochs]))
    times = {trainer.graph: steady, other.graph: other_epoch}
    print(f"time per epoch, training only: step captured as a graph {times[True]:.3f} s, "
          f"eager {times[False]:.3f} s ({times[False] / times[True]:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
