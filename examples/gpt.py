"""A small character-level GPT learns to write like Python's documentation.

    python -m examples.gpt [--handler auto|numpy|pycuda] [--steps N] [--save PATH]

The text is the help topics every Python install carries
(``pydoc_data.topics``, about 0.8 MB).  The model is a GPT built from the
library's layers: token and position embeddings, blocks of pre-norm causal
self-attention and a GELU MLP, each inside a ``Residual``, a last LayerNorm
and a dense layer to the characters, trained with Adam on a warm-up and
cosine learning-rate schedule and the gradients clipped by their global
norm.  On a GPU (``PyCudaHandler``) the model has 4 blocks of width 256, 4
heads and a context of 128; on NumPy 2 blocks of width 64 and a context of
32, so that ``make demo`` stays short on a small CPU.

Prints the loss as it trains and on held-out text, samples a few lines at
the end, saves the model (``net.save``, a safetensors file), and exits with
status 1 unless the held-out loss fell below :data:`TARGET_LOSS`.
"""
import argparse
import sys
import time

import numpy as np

from layers import (
    GELU,
    Adam,
    Embedding,
    FullyConnected,
    LayerNorm,
    MultiHeadAttention,
    PositionEmbedding,
    Reshape,
    Residual,
    Sequential,
    SoftmaxCrossEntropy,
)
from layers.schedules import WarmupCosine, clip_grad_norm

from .digits import make_handler

#: per character, nats: the uniform guess over ~100 characters is 4.6
TARGET_LOSS = 2.6
#: (blocks, width, heads, context, batch, steps) per handler kind
SIZES = {"gpu": (4, 256, 4, 128, 32, 1500), "cpu": (2, 64, 4, 32, 16, 500)}


def load_text():
    """The help topics' text, and its characters in order."""
    from pydoc_data.topics import topics
    text = "\n".join(topics[k] for k in sorted(topics))
    return text, sorted(set(text))


def build(h, vocab, blocks, width, heads, context, seed):
    """The GPT: embeddings, ``blocks`` pre-norm transformer blocks, the head."""
    layers = [Embedding(vocab, width), PositionEmbedding(context, width)]
    for _ in range(blocks):
        layers += [Residual([LayerNorm(width), MultiHeadAttention(width, heads, causal=True)]),
                   Residual([LayerNorm(width), FullyConnected(width, 4 * width), GELU(),
                             FullyConnected(4 * width, width)])]
    layers += [LayerNorm(width), FullyConnected(width, vocab), Reshape(-1, vocab)]
    return Sequential(h, layers, SoftmaxCrossEntropy(), seed=seed)


def windows(data, starts, context):
    """Inputs (B, context) and next-character targets (B * context, 1)."""
    idx = starts[:, None] + np.arange(context + 1)
    seq = data[idx].astype(np.float64)
    return seq[:, :-1], seq[:, 1:].reshape(-1, 1)


def sample(net, h, start, chars, length, context, rng, temperature=0.8):
    """``length`` characters after the ids ``start``, each drawn from the
    model's distribution over the last ``context`` characters."""
    ids = list(start)
    for _ in range(length):
        x = h.create_from_numpy(np.array([ids[-context:]], dtype=np.float64))
        logits = h.get_numpy_copy(net.forward(x))[-1].astype(np.float64) / temperature
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return "".join(chars[i] for i in ids[len(start):])


def evaluate(net, h, data, context, batch, rng, batches=8):
    """Mean loss over random held-out windows."""
    total = 0.0
    for _ in range(batches):
        x, t = windows(data, rng.integers(0, len(data) - context - 1, batch), context)
        loss = net.evaluate_batch(h.create_from_numpy(x), h.create_from_numpy(t))[0]
        total += float(h.get_numpy_copy(loss)[0])
    return total / batches


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m examples.gpt", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--handler", choices=("auto", "numpy", "pycuda"), default="auto")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: by size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default="gpt_model.safetensors",
                   help="safetensors file for the trained model ('' for none)")
    args = p.parse_args(argv)
    h = make_handler(args.handler, np.float32, args.seed)
    kind = "cpu" if type(h).__name__ == "NumpyHandler" else "gpu"
    blocks, width, heads, context, batch, steps = SIZES[kind]
    steps = args.steps or steps
    text, chars = load_text()
    data = np.searchsorted(np.array(chars), np.array(list(text)))   # ids, chars sorted
    split = int(0.9 * len(data))
    train, held = data[:split], data[split:]
    net = build(h, len(chars), blocks, width, heads, context, args.seed)
    print(f"{type(h).__name__}: GPT of {blocks} blocks, width {width}, {heads} heads, context "
          f"{context}, {net.parameters.count:,} parameters; {len(text):,} characters of "
          f"pydoc_data.topics, {len(chars)} distinct")
    opt = Adam(net.parameters, lr=0.0)
    schedule = WarmupCosine(3e-3 if kind == "cpu" else 1e-3, warmup=steps // 10, total=steps,
                            min_lr=1e-4)
    rng = np.random.default_rng(args.seed)
    start, every = time.perf_counter(), max(1, steps // 10)
    hx, ht = h.allocate((batch, context)), h.allocate((batch * context, 1))   # reused
    for step in range(steps):
        opt.lr = schedule(step)
        x, t = windows(train, rng.integers(0, len(train) - context - 1, batch), context)
        h.set_from_numpy(hx, x)
        h.set_from_numpy(ht, t)
        loss = net.train_step(hx, ht)
        clip_grad_norm(net.parameters, 1.0)
        opt.step()
        if (step + 1) % every == 0 or step == 0:
            print(f"step {step + 1:5d}  loss {float(h.get_numpy_copy(loss)[0]):.3f}  "
                  f"lr {opt.lr:.2e}  {time.perf_counter() - start:.1f} s", flush=True)
    held_loss = evaluate(net, h, held, context, batch, rng)
    print(f"held-out loss {held_loss:.3f} per character (target below {TARGET_LOSS})")
    prompt = "The "
    ids = [chars.index(c) for c in prompt]
    for _ in range(3):
        print(repr(prompt + sample(net, h, ids, chars, 80, context, rng)))
    if args.save:
        net.save(args.save)
        print(f"saved the trained model: {args.save}")
    return 0 if held_loss < TARGET_LOSS else 1


if __name__ == "__main__":
    sys.exit(main())
