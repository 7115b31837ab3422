"""A small convolutional network names the 8x8 handwritten digits.

    python -m examples.conv_digits [--handler auto|numpy|pycuda] [--epochs N] [--plot PATH]
                                   [--save PATH]

The same data set, split and seed as ``examples.digits`` (scikit-learn's 1797
8x8 digits), read as images (N, 1 channel, 8, 8) instead of row sequences.  The
model: Conv2D(1 -> 8, 3x3, padding 1), ReLU, MaxPool2D(2), Conv2D(8 -> 16,
3x3, padding 1), ReLU, MaxPool2D(2), Flatten, FullyConnected(64 -> 10), a
softmax cross-entropy loss, SGD with momentum.

Runs on PyCudaHandler where a GPU is present (cuDNN convolutions), else on
NumpyHandler (im2col and BLAS); ``--handler`` chooses explicitly.  Prints the
handler, the time per epoch and the test accuracy, writes the loss curve as a
PNG, saves the trained model and loads it back on NumpyHandler in float64 (as
``examples.digits`` does), and exits with status 1 if the test accuracy is
below the target.
"""
import sys
import time

import numpy as np

from examples import digits
from examples.digits import epoch_printer, make_handler, plot_losses, save_and_reload
from layers import (
    SGD,
    Conv2D,
    Flatten,
    FullyConnected,
    MaxPool2D,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    Trainer,
    accuracy,
)

TARGET_ACCURACY = 0.95


def load_images(seed):
    """``examples.digits.load_images`` with a channel axis: x (n, 1, 8, 8)."""
    (x_tr, y_tr), (x_te, y_te) = digits.load_images(seed)
    return (x_tr[:, None], y_tr), (x_te[:, None], y_te)


def build(h, seed, width=8):
    """The conv net of the module docstring, ``width`` channels in its first layer."""
    return Sequential(h, [Conv2D(1, width, 3, padding=1), ReLU(), MaxPool2D(2),
                          Conv2D(width, 2 * width, 3, padding=1), ReLU(), MaxPool2D(2),
                          Flatten(), FullyConnected(2 * width * 2 * 2, 10)],
                      SoftmaxCrossEntropy(), seed=seed)


def main(argv=None):
    """Train, print the test accuracy; returns the exit status."""
    args = digits.demo_arguments("python -m examples.conv_digits", __doc__, 15, 0.05,
                                 "conv_digits_loss.png",
                                 "conv_digits_model.safetensors").parse_args(argv)

    (x_tr, y_tr), (x_te, y_te) = load_images(args.seed)
    h = make_handler(args.handler, np.float64 if args.float64 else np.float32, args.seed)
    net = build(h, args.seed)
    opt = SGD(net.parameters, lr=args.lr, momentum=args.momentum)
    trainer = Trainer(net, opt, batch_size=args.batch_size, seed=args.seed,
                      progress=False if args.no_progress else None,
                      metrics={"accuracy": accuracy},
                      precision=args.precision)
    print(f"handler: {h!r}" + (f", computing in {net.h.dtype} (mixed precision)"
                                if args.precision else ""))
    print(f"data: {len(x_tr)} training and {len(x_te)} test images of 1x8x8; "
          f"model: {net}, {net.parameters.count} parameters")
    start = time.perf_counter()
    history = trainer.fit(x_tr, y_tr, args.epochs, eval_data=(x_te, y_te),
                          on_epoch=epoch_printer(trainer))
    seconds = time.perf_counter() - start
    acc = history.epochs[-1]["eval_accuracy"]
    steady = np.median([e["seconds"] for e in history.epochs])
    mixed = f", computing in {net.h.dtype.name}" if args.precision else ""
    print(f"handler: {type(h).__name__} ({h.dtype.name}{mixed}); {args.epochs} epochs in "
          f"{seconds:.1f} s with evaluation, {steady:.3f} s per epoch (median)")
    print(f"test accuracy: {acc:.4f} (target >= {TARGET_ACCURACY}: "
          f"{'met' if acc >= TARGET_ACCURACY else 'MISSED'})")
    if args.save:
        save_and_reload(net, args.save, lambda h64: build(h64, args.seed), x_te, y_te, acc)
    if args.plot:
        try:
            plot_losses(history, args.plot, f"conv net on digits, {type(h).__name__}")
            print(f"loss curve: {args.plot}")
        except ImportError:
            print("matplotlib is not installed: no loss curve (pip install matplotlib)")
    return 0 if acc >= TARGET_ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
