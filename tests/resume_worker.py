"""Phases of resumed training runs, in processes of their own (see
tests/test_resume.py, which also imports ``build`` and ``problem`` from here
for its in-process cases)::

    python tests/resume_worker.py HANDLER_ID MODE FOLDER RUN [RUN ...]

A RUN is ``<optimizer>-<precision>``: optimizer ``sgd``, ``adam`` or
``adamw``, precision ``none``, ``bf16`` or ``fp16`` (``"adam-bf16"``).  The
trainer captures its step where the handler prefers it (``graph=None``: on a
GPU).  Modes, each over its RUNs in turn:

* ``full``: train ``EPOCHS`` epochs uninterrupted;
* ``stop``: train ``STOP_AT`` epochs, then ``trainer.save``;
* ``interrupt``: ``fit(EPOCHS, checkpoint=...)`` while the network's
  ``Interrupter`` raises SIGINT on its ``INTERRUPT_AT``-th training forward
  (step 3 of the first epoch, eager or captured); the ``KeyboardInterrupt``
  goes out uncaught, as a Ctrl-C's would, so one RUN only;
* ``wait``: ``fit(EPOCHS, checkpoint=...)``, eager, every training forward
  slowed down by ``SLOW_S``; the file ``FOLDER/wait/RUN.ready`` appears after
  the first one, so the test can send a real SIGINT from outside; one RUN;
* ``resume``: each RUN is ``<mode>/<run>`` (``"stop/sgd-none"``): build that
  run afresh (another initialization seed), ``trainer.load`` the file that
  mode saved, then fit to ``EPOCHS``.

Files: ``FOLDER/<mode>/<run>.safetensors``; ``full`` and ``resume``
(``FOLDER/resumed/<mode>/<run>.safetensors``) hold the final
``trainer.state_dict()`` (the network's parameters under ``"net."``, the
optimizer's state, ...), written with ``layers.checkpoint.save``; ``stop``,
``interrupt`` and ``wait`` the trainer's own checkpoint.
"""
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from handlers.testing import make_handler  # noqa: E402
from layers import (  # noqa: E402
    SGD,
    Adam,
    AdamW,
    Dropout,
    FullyConnected,
    Layer,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    Trainer,
    checkpoint,
)

#: epochs of the whole run
EPOCHS = 4
#: 90 samples in batches of 16: six steps an epoch, the last of 10 samples
SAMPLES, BATCH, FEATURES, CLASSES = 90, 16, 8, 3
#: seeds of the handler (dropout's masks), the shuffling and the initialization
HANDLER_SEED, SHUFFLE_SEED, INIT_SEED = 5, 3, 1
#: the initialization seed of a resumed run's fresh network (overwritten by the load)
OTHER_INIT_SEED = 99
#: the epochs a ``stop`` run trains before it saves
STOP_AT = 2
#: the training forward on which an ``interrupt`` run's SIGINT comes: step 3
#: of the first epoch, eager or captured (a capture runs the Python forward
#: in the eager warm-up step and in the two captures, steps 1 to 3)
INTERRUPT_AT = 3
#: seconds each training forward sleeps in the ``wait`` mode
SLOW_S = 0.05


class Interrupter(Layer):
    """Identity layer (no parameters) that raises SIGINT on its ``at``-th
    training forward (never with ``at`` None), as a Ctrl-C in the middle of
    a step would; with ``ready`` a path, it creates that file on its first
    training forward; each training forward sleeps ``sleep`` seconds."""

    def __init__(self, at=None, ready=None, sleep=0.0):
        super().__init__()
        self.at, self.ready, self.sleep = at, ready, sleep
        self.calls = 0

    def __repr__(self):
        return f"Interrupter(at={self.at})"

    def forward(self, x, training=True):
        if training:
            self.calls += 1
            if self.ready is not None and self.calls == 1:
                Path(self.ready).touch()
            if self.sleep:
                time.sleep(self.sleep)
            if self.calls == self.at:
                signal.raise_signal(signal.SIGINT)
        return x

    def backward(self, dy):
        return dy if self.input_grad else None


def problem(seed=0):
    """(x, y): a small classification problem."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, SAMPLES)
    centers = rng.normal(0.0, 1.0, (CLASSES, FEATURES))
    return centers[y] + rng.normal(0.0, 0.8, (SAMPLES, FEATURES)), y


def optimizer(name, parameters):
    if name == "sgd":
        return SGD(parameters, lr=0.05, momentum=0.9)
    if name == "adam":
        return Adam(parameters, lr=0.01)
    if name == "adamw":
        return AdamW(parameters, lr=0.01, weight_decay=0.05)
    raise ValueError(f"unknown optimizer {name!r}")


def build(handler_id, opt="sgd", precision=None, graph=None, init_seed=INIT_SEED,
          interrupter=None):
    """A fresh run: handler (seeded with ``HANDLER_SEED``), network
    FullyConnected -> ReLU -> Interrupter -> Dropout(0.2) -> FullyConnected
    initialized from ``init_seed``, optimizer and trainer.  ``interrupter``
    is the Interrupter to use (one that never fires by default)."""
    h = make_handler(handler_id, seed=HANDLER_SEED)
    net = Sequential(h, [FullyConnected(FEATURES, 16), ReLU(), interrupter or Interrupter(),
                         Dropout(0.2), FullyConnected(16, CLASSES)],
                     SoftmaxCrossEntropy(), seed=init_seed)
    return Trainer(net, optimizer(opt, net.parameters), batch_size=BATCH, seed=SHUFFLE_SEED,
                   progress=False, graph=graph, precision=precision)


def parse_run(run):
    """(optimizer, precision) of a RUN such as ``"adam-bf16"``."""
    opt, precision = run.split("-")
    return opt, None if precision == "none" else precision


def main(argv):
    handler_id, mode, folder, *runs = argv
    folder = Path(folder)
    x, y = problem()
    for run in runs:
        if mode == "resume":
            target = folder / "resumed" / f"{run}.safetensors"
            target.parent.mkdir(parents=True, exist_ok=True)
            trainer = build(handler_id, *parse_run(run.split("/")[1]),
                            init_seed=OTHER_INIT_SEED)
            trainer.load(folder / f"{run}.safetensors")
            trainer.fit(x, y, EPOCHS)
            checkpoint.save(target, trainer.state_dict())
            continue
        target = folder / mode / f"{run}.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "full":
            trainer = build(handler_id, *parse_run(run))
            trainer.fit(x, y, EPOCHS)
            checkpoint.save(target, trainer.state_dict())
        elif mode == "stop":
            trainer = build(handler_id, *parse_run(run))
            trainer.fit(x, y, STOP_AT)
            trainer.save(target)
        elif mode == "interrupt":
            trainer = build(handler_id, *parse_run(run),
                            interrupter=Interrupter(at=INTERRUPT_AT))
            trainer.fit(x, y, EPOCHS, checkpoint=target)
            raise SystemExit("interrupt: fit returned without a KeyboardInterrupt")
        elif mode == "wait":
            ready = target.with_suffix(".ready")
            trainer = build(handler_id, *parse_run(run), graph=False,   # every forward sleeps
                            interrupter=Interrupter(ready=ready, sleep=SLOW_S))
            trainer.fit(x, y, EPOCHS, checkpoint=target)
            raise SystemExit("wait: fit ended before the SIGINT came")
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
