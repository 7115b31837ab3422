"""State dicts, checkpoint files and handler random states.

What must hold: a network's state dict names each parameter
"<position>.<class>.<name>", in order, with host copies of the values its
layers' views hold; a checkpoint file written on one handler loads on any
other with the values exact (a float32 file into float64 or into the float32
master copy of a bfloat16 mixed-precision network; a float64 file into float32
only with ``cast=True``, rounded as NumPy rounds); every load that does not
fit raises, naming the entry, with nothing written (the network, the
optimizer, the trainer); the file is plain safetensors with the plain values
as JSON in its header; a save killed at any moment leaves the previous file
whole; objects whose arrays are views of shared buffers refuse pickle and
copy; a handler's random state restores its draws, for its views and twins.

References are independent of the code under test: parameters are set and
read through the layers' own views (not through ``state_dict``), and values
are compared with float64 NumPy copies of fresh random data, as the handler
holds them.
"""
import copy
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from handlers import CaptureError, DebugHandler, NumpyHandler
from handlers.testing import LAYER_TOLERANCE, assert_normwise_close
from helpers import as_handler_values, rand
from layers import (
    LSTM,
    SGD,
    Adam,
    Conv2D,
    Dropout,
    Embedding,
    Flatten,
    FullyConnected,
    LayerNorm,
    LossScaler,
    MaxPool2D,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
    SquaredError,
    Tanh,
    Trainer,
    checkpoint,
)
from layers.data_parallel import DataParallel

REPO = Path(__file__).resolve().parents[1]


# ============================================================================ helpers
def mlp(h, seed=0):
    return Sequential(h, [FullyConnected(6, 16), Tanh(), FullyConnected(16, 8), ReLU(),
                          FullyConnected(8, 3)], SquaredError(), seed=seed)


def lstm_net(h, seed=0):
    return Sequential(h, [LSTM(3, 8, return_sequences=False), Dropout(0.25),
                          FullyConnected(8, 6), ReLU(), LayerNorm(6), FullyConnected(6, 2)],
                      SoftmaxCrossEntropy(), seed=seed)


#: network builders and the state-dict names and shapes each must give, in order
NETWORKS = {
    "lstm": (lstm_net, [
        ("0.LSTM.Wx", (4, 3, 8)), ("0.LSTM.Wh", (4, 8, 8)), ("0.LSTM.b", (4, 1, 8)),
        ("2.FullyConnected.W", (8, 6)), ("2.FullyConnected.b", (1, 6)),
        ("4.LayerNorm.gain", (1, 6)), ("4.LayerNorm.bias", (1, 6)),
        ("5.FullyConnected.W", (6, 2)), ("5.FullyConnected.b", (1, 2))]),
    "conv": (lambda h, seed=0: Sequential(
        h, [Conv2D(1, 2, 3), ReLU(), MaxPool2D(2), Flatten(), FullyConnected(8, 3)],
        SoftmaxCrossEntropy(), seed=seed), [
        ("0.Conv2D.W", (2, 1, 3, 3)), ("0.Conv2D.b", (2,)),
        ("4.FullyConnected.W", (8, 3)), ("4.FullyConnected.b", (1, 3))]),
    "embedding": (lambda h, seed=0: Sequential(
        h, [Embedding(10, 4), FullyConnected(4, 4), Tanh(), FullyConnected(4, 4)],
        SoftmaxCrossEntropy(), seed=seed), [
        ("0.Embedding.W", (10, 4)), ("1.FullyConnected.W", (4, 4)),
        ("1.FullyConnected.b", (1, 4)), ("3.FullyConnected.W", (4, 4)),
        ("3.FullyConnected.b", (1, 4))]),
}


def randomize(net, rng):
    """Fresh random values into every parameter, written through the layers'
    own views; returns {state-dict name: float64 copy of the values as the
    handler holds them}.  Not for a network in mixed precision (its views
    are the half working copy)."""
    h, want = net.parameters.h, {}
    for i, layer in enumerate(net.layers):
        for name, view in layer.params.items():
            values = rand(view.shape, rng)
            h.set_from_numpy(view, values)
            want[f"{i}.{type(layer).__name__}.{name}"] = as_handler_values(h, values)
    return want


def view_values(net):
    """{state-dict name: host copy} of every parameter, read through the
    layers' own views (not through ``state_dict``)."""
    h = net.parameters.h
    return {f"{i}.{type(layer).__name__}.{name}": h.get_numpy_copy(view)
            for i, layer in enumerate(net.layers) for name, view in layer.params.items()}


def assert_values(got, want, what=""):
    """``got`` ({name: array}) holds exactly ``want``'s names and values (in
    any order: a file's order is its own)."""
    assert sorted(got) == sorted(want), what
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name], np.float64), want[name],
                                      err_msg=f"{what} {name}")


def bits(h, *arrays):
    """The bytes of handler arrays, to compare bit for bit."""
    return [h.get_numpy_copy(a).tobytes() for a in arrays]


def optimizer_bits(opt):
    """The bytes of everything an optimizer holds (buffers, lr, step count)."""
    h = opt.parameters.h
    if isinstance(opt, SGD):
        return bits(h, opt.velocity) + [opt.lr, opt.momentum]
    return bits(h, opt.m, opt.v) + [opt.lr, opt.steps]


def trainer_bits(t):
    """Everything a trainer's load may write: parameters, optimizer, loss
    scaler, position, shuffling and handler random state."""
    h = t.net.parameters.h
    scaler = [] if t.net.loss_scaler is None else list(t.net.loss_scaler.read())
    return (bits(h, t.net.params) + optimizer_bits(t.optimizer) + scaler
            + [t.epoch, t.step, t.rng.bit_generator.state, h.random_state()])


def regression_batch(h, rng, n=8):
    return h.create_from_numpy(rand((n, 6), rng)), h.create_from_numpy(rand((n, 3), rng))


def stepped(opt, net, rng, steps=2):
    """``opt`` after a few training steps on random data (so that its buffers
    are not all zero)."""
    for _ in range(steps):
        net.train_step(*regression_batch(net.h, rng))
        opt.step()
    return opt


def classes(rng, n=24):
    return rand((n, 6), rng), rng.integers(0, 3, n)


def classifier(h, seed):
    return Sequential(h, [FullyConnected(6, 8), Tanh(), FullyConnected(8, 3)],
                      SoftmaxCrossEntropy(), seed=seed)


# ============================================================================ 1. names
@pytest.mark.parametrize("kind", sorted(NETWORKS))
def test_state_dict_names_values_and_copies(handler, rng, kind):
    """Names "<position>.<class>.<param>" in layer order (layers without
    parameters keep their positions), each array the value the layer's view
    holds, in the handler's format, and a copy: changing it changes nothing."""
    build, expected = NETWORKS[kind]
    net = build(handler, seed=1)
    want = randomize(net, rng)
    state = net.state_dict()
    assert [(k, v.shape) for k, v in state.items()] == expected
    held = view_values(net)
    for name, a in state.items():
        assert isinstance(a, np.ndarray) and a.dtype == handler.dtype, name
        np.testing.assert_array_equal(a, held[name], err_msg=name)
        np.testing.assert_array_equal(a.astype(np.float64), want[name], err_msg=name)
    before = bits(handler, net.params)
    for a in state.values():
        a[...] = 7.0
    assert bits(handler, net.params) == before
    assert_values(view_values(net), want, "after changing the state dict")
    assert_values(net.state_dict(), want, "a second state dict")


# ============================================================================ 2. round trips
def test_round_trip_through_a_file(handler, tmp_path, rng):
    """A checkpoint of ``handler`` loads into float64 NumPy exactly, and a
    float32 NumPy checkpoint into ``handler`` exactly (float32 widens to
    float64 exactly); a Trainer's checkpoint loads into a bare network."""
    src = lstm_net(handler, seed=1)
    want = randomize(src, rng)
    src.save(tmp_path / "a.safetensors")
    dst = lstm_net(NumpyHandler(np.float64), seed=2)
    dst.load(tmp_path / "a.safetensors")
    assert_values(view_values(dst), want, "handler -> numpy-f64")

    src32 = lstm_net(NumpyHandler(np.float32), seed=3)
    want32 = randomize(src32, rng)
    src32.save(str(tmp_path / "b.safetensors"))     # str or Path
    dst = lstm_net(handler, seed=4)
    dst.load(str(tmp_path / "b.safetensors"))
    assert_values(view_values(dst), want32, "numpy-f32 -> handler")

    trained = mlp(handler, seed=5)
    want_t = randomize(trained, rng)
    Trainer(trained, SGD(trained.parameters), progress=False).save(tmp_path / "t.safetensors")
    bare = mlp(NumpyHandler(np.float64), seed=6)
    bare.load(tmp_path / "t.safetensors")
    assert_values(view_values(bare), want_t, "trainer checkpoint -> network")


def test_float32_checkpoint_into_bf16_mixed_precision_master(handler, tmp_path, rng):
    """A float32 file loads exactly into the master parameters of a network
    computing in bfloat16, and its forward pass then matches the float32
    network's within bfloat16's tolerance."""
    ref = mlp(NumpyHandler(np.float32), seed=1)
    want = randomize(ref, rng)
    ref.save(tmp_path / "f32.safetensors")
    net = mlp(handler, seed=2)
    net.mixed_precision("bfloat16")
    net.load(tmp_path / "f32.safetensors")
    master = net.state_dict()
    assert all(a.dtype == handler.dtype for a in master.values())
    assert_values(master, want, "master parameters")
    np.testing.assert_array_equal(net.parameters.get().astype(np.float64),
                                  ref.parameters.get().astype(np.float64))
    x = rand((16, 6), rng)
    y_ref = ref.h.get_numpy_copy(ref.forward(ref.h.create_from_numpy(x))).astype(np.float64)
    y = net.h.get_numpy_copy(net.forward(net.input_h.create_from_numpy(x)))
    assert_normwise_close(y_ref, y.astype(np.float64), LAYER_TOLERANCE["bfloat16"],
                          "bf16 forward after the load", "float32", "bf16")


# ============================================================================ 3. load errors
def _missing(s):
    del s["2.FullyConnected.b"]
    return "2.FullyConnected.b"


def _unexpected(s):
    s["9.FullyConnected.W"] = np.zeros((2, 2), np.float32)
    return "9.FullyConnected.W"


def _wrong_shape(s):
    s["0.LSTM.Wh"] = np.ascontiguousarray(s["0.LSTM.Wh"][:, :, :-1])
    return "0.LSTM.Wh"


def _not_an_array(s):
    s["4.LayerNorm.gain"] = 1.0
    return "4.LayerNorm.gain"


def _ints(s):
    s["5.FullyConnected.b"] = np.ones((1, 2), np.int32)
    return "5.FullyConnected.b"


@pytest.mark.parametrize("spoil", [_missing, _unexpected, _wrong_shape, _not_an_array, _ints],
                         ids=lambda f: f.__name__.strip("_"))
def test_network_load_errors_name_the_entry_and_write_nothing(handler, rng, spoil):
    """Each mismatch raises ValueError naming the entry; the network keeps
    its parameters bit for bit (the state is of a network with other values,
    which loads once whole)."""
    src = lstm_net(NumpyHandler(np.float32), seed=1)
    want = randomize(src, rng)
    dst = lstm_net(handler, seed=2)
    randomize(dst, rng)
    before = bits(handler, dst.params)
    state = src.state_dict()
    name = spoil(state)
    for cast in (False, True):
        with pytest.raises(ValueError, match=re.escape(repr(name))):
            dst.load_state_dict(state, cast=cast)
        assert bits(handler, dst.params) == before
    dst.load_state_dict(src.state_dict())
    assert_values(view_values(dst), want, "the whole state")


@pytest.mark.parametrize("target", ["network", "optimizer"])
@pytest.mark.parametrize("bad", [None, [1, 2], "state", 3.0], ids=repr)
def test_non_mapping_state_is_a_type_error(handler, target, bad):
    """A state that is no mapping is a TypeError saying a state dict is wanted."""
    net = mlp(handler)
    obj = net if target == "network" else Adam(net.parameters)
    with pytest.raises(TypeError, match="state dict"):
        obj.load_state_dict(bad)


def test_non_mapping_trainer_state_is_a_type_error(handler):
    """As for a network and an optimizer: TypeError, not AttributeError."""
    net = mlp(handler)
    t = Trainer(net, SGD(net.parameters), progress=False)
    with pytest.raises(TypeError, match="state dict"):
        t.load_state_dict([("net.0.FullyConnected.W", 1.0)])


def test_float64_checkpoint_into_float32_needs_cast(make_handler, handler_id, tmp_path, rng):
    """float64 into float32 would round: ValueError saying cast=True, with
    nothing written; with cast=True the values are np.float32 of the file's."""
    h32 = make_handler(handler_id, dtype=np.float32)
    src = lstm_net(NumpyHandler(np.float64), seed=1)
    want = randomize(src, rng)
    assert any((np.float32(a) != a).any() for a in want.values())   # it does round
    src.save(tmp_path / "f64.safetensors")
    dst = lstm_net(h32, seed=2)
    before = bits(h32, dst.params)
    for load in (lambda: dst.load_state_dict(src.state_dict()),
                 lambda: dst.load(tmp_path / "f64.safetensors")):
        with pytest.raises(ValueError, match=r"'0\.LSTM\.Wx'.*cast=True"):
            load()
        assert bits(h32, dst.params) == before
    dst.load(tmp_path / "f64.safetensors", cast=True)
    assert_values(view_values(dst), {k: v.astype(np.float32).astype(np.float64)
                                     for k, v in want.items()}, "cast=True")


def test_optimizer_load_errors_write_nothing(handler, rng):
    """An SGD state into Adam, and an Adam state of other betas, raise
    ValueError naming what differs; the optimizer and the parameters stay as
    they were.  The same state loads into an Adam built with its betas."""
    net_a, net_b = mlp(handler, seed=1), mlp(handler, seed=2)
    sgd = stepped(SGD(net_a.parameters, lr=0.05, momentum=0.5), net_a, rng)
    adam_a = stepped(Adam(net_a.parameters, lr=0.01, betas=(0.8, 0.99)), net_a, rng, steps=3)
    adam_b = stepped(Adam(net_b.parameters, lr=0.02), net_b, rng)
    before, params = optimizer_bits(adam_b), bits(handler, net_b.params)
    with pytest.raises(ValueError, match="state is of SGD, not Adam"):
        adam_b.load_state_dict(sgd.state_dict())
    assert optimizer_bits(adam_b) == before and bits(handler, net_b.params) == params
    with pytest.raises(ValueError, match=r"betas is \[0\.8, 0\.99\]"):
        adam_b.load_state_dict(adam_a.state_dict())
    assert optimizer_bits(adam_b) == before and bits(handler, net_b.params) == params
    with pytest.raises(ValueError, match="state is of Adam, not SGD"):
        SGD(net_b.parameters).load_state_dict(adam_a.state_dict())

    same = Adam(net_b.parameters, lr=0.5, betas=(0.8, 0.99))
    same.load_state_dict(adam_a.state_dict())
    assert optimizer_bits(same) == optimizer_bits(adam_a)
    assert (same.lr, same.steps) == (0.01, 3)
    assert bits(handler, net_b.params) == params     # the optimizer's state only


def test_trainer_state_of_an_fp16_run_needs_loss_scaling(handler, rng):
    """A float16 run's state (it has a loss scaler's part) into a trainer
    without loss scaling, and the reverse: ValueError, nothing written."""
    net_a, net_b = mlp(handler, seed=1), mlp(handler, seed=2)
    fp16 = Trainer(net_a, SGD(net_a.parameters, lr=0.05), precision="fp16", progress=False)
    plain = Trainer(net_b, SGD(net_b.parameters, lr=0.05), progress=False)
    stepped(plain.optimizer, net_b, rng)
    state = fp16.state_dict()
    assert any(k.startswith("loss_scaler.") for k in state)
    before = trainer_bits(plain)
    with pytest.raises(ValueError, match="with float16 loss scaling"):
        plain.load_state_dict(state)
    assert trainer_bits(plain) == before
    before = trainer_bits(fp16)
    with pytest.raises(ValueError, match="without float16 loss scaling"):
        fp16.load_state_dict(plain.state_dict())
    assert trainer_bits(fp16) == before


def _epoch_str(s):
    s["trainer.epoch"] = str(s["trainer.epoch"])
    return "'epoch' must be int"


def _bad_shuffle(s):
    s["trainer.shuffle"] = {"bit_generator": "Nope"}
    return "'shuffle' is not a generator state"


def _two_randoms(s):
    s["trainer.random"] = s["trainer.random"] * 2
    return "random states of 2 processes"


def _stray(s):
    s["net.9.FullyConnected.W"] = np.zeros((2, 2), np.float32)
    return "'9.FullyConnected.W'"


@pytest.mark.parametrize("spoil", [_epoch_str, _bad_shuffle, _two_randoms, _stray],
                         ids=lambda f: f.__name__.strip("_"))
def test_trainer_checks_everything_before_writing(handler, rng, spoil):
    """A trained run's state whose last-checked part (the trainer's own) is
    bad: ValueError naming it, and the network, optimizer, position and
    random states of the trainer stay as they were.  The good state then
    loads whole."""
    x, y = classes(rng)
    net_a, net_b = classifier(handler, 1), classifier(handler, 2)
    a = Trainer(net_a, Adam(net_a.parameters, lr=0.01), batch_size=8, seed=3, progress=False)
    a.fit(x, y, epochs=1)
    b = Trainer(net_b, Adam(net_b.parameters, lr=0.02), batch_size=8, seed=4, progress=False)
    state = a.state_dict()
    _draw(handler)          # so that writing the state's random state would show
    bad = dict(state)
    message = spoil(bad)
    before = trainer_bits(b)
    with pytest.raises(ValueError, match=re.escape(message)):
        b.load_state_dict(bad)
    assert trainer_bits(b) == before
    b.load_state_dict(state)
    assert trainer_bits(b) == trainer_bits(a)


def test_trainer_bad_random_state_writes_nothing(handler, rng):
    """A random state of the right generator but garbage contents, in the
    state of a trained run (another position, shuffling state, parameters)."""
    x, y = classes(rng)
    net_a, net_b = classifier(handler, 1), classifier(handler, 2)
    a = Trainer(net_a, SGD(net_a.parameters), batch_size=8, seed=3, progress=False)
    a.fit(x, y, epochs=1)
    b = Trainer(net_b, SGD(net_b.parameters), batch_size=8, seed=4, progress=False)
    state = a.state_dict()
    state["trainer.random"] = [{k: (v if k == "generator" else "garbage")
                                for k, v in handler.random_state().items()}]
    before = trainer_bits(b)
    with pytest.raises(ValueError):
        b.load_state_dict(state)
    assert trainer_bits(b) == before


# ============================================================================ 4. the file
def test_file_is_safetensors_with_json_values(tmp_path, rng):
    """The tensors are the state's arrays under their names; the header's
    "streamhandlers" metadata is JSON of the plain values."""
    x, y = classes(rng)
    net = classifier(NumpyHandler(np.float32), 1)
    t = Trainer(net, SGD(net.parameters, lr=0.05, momentum=0.5), batch_size=8, progress=False)
    t.fit(x, y, epochs=1)
    want = view_values(net)
    path = tmp_path / "run.safetensors"
    t.save(path)
    state = t.state_dict()
    arrays = {k for k, v in state.items() if isinstance(v, np.ndarray)}
    assert {"net.0.FullyConnected.W", "optimizer.velocity.2.FullyConnected.b"} <= arrays
    with safe_open(str(path), framework="numpy") as f:
        assert set(f.keys()) == arrays
        for name in arrays:
            got = f.get_tensor(name)
            assert got.dtype == state[name].dtype, name
            np.testing.assert_array_equal(got, state[name], err_msg=name)
        for name, values in want.items():
            np.testing.assert_array_equal(f.get_tensor("net." + name), values)
        doc = json.loads(f.metadata()["streamhandlers"])
    plain = {k: v for k, v in state.items() if k not in arrays}
    assert doc == {"version": checkpoint.FORMAT_VERSION, "values": plain}
    assert plain["optimizer.optimizer"] == "SGD" and plain["optimizer.lr"] == 0.05
    assert plain["trainer.epoch"] == 1 and plain["trainer.step"] == 0
    loaded = checkpoint.load(path)
    assert set(loaded) == set(state)
    assert {k: v for k, v in loaded.items() if k not in arrays} == plain


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_plain_safetensors_file_loads(tmp_path, rng, metadata):
    """A file of plain ``safetensors.numpy.save_file`` (no streamhandlers
    metadata) gives its tensors, and a network loads it."""
    net = mlp(NumpyHandler(np.float32), seed=1)
    arrays = {name: rand(shape, rng).astype(np.float32)
              for name, shape in [("0.FullyConnected.W", (6, 16)),
                                  ("0.FullyConnected.b", (1, 16)),
                                  ("2.FullyConnected.W", (16, 8)),
                                  ("2.FullyConnected.b", (1, 8)),
                                  ("4.FullyConnected.W", (8, 3)),
                                  ("4.FullyConnected.b", (1, 3))]}
    path = tmp_path / "plain.safetensors"
    save_file(arrays, str(path), metadata=metadata)
    loaded = checkpoint.load(path)
    assert set(loaded) == set(arrays)
    for name, a in arrays.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], a)
    net.load(path)
    assert_values(view_values(net), {k: v.astype(np.float64) for k, v in arrays.items()})


def _truncated(tmp_path, rng):
    src = tmp_path / "whole.safetensors"
    checkpoint.save(src, {"x": rand((100, 100), rng), "lr": 0.1})
    return src.read_bytes()[:5000]


@pytest.mark.parametrize("contents", [
    lambda tmp_path, rng: b"",
    lambda tmp_path, rng: b"this is not a checkpoint\n" * 20,
    lambda tmp_path, rng: rng.bytes(4096),
    _truncated,
], ids=["empty", "text", "random bytes", "truncated"])
def test_garbage_file_is_a_value_error(tmp_path, rng, contents):
    """A file that is not safetensors (or a torn one) is a ValueError, and a
    network asked to load it keeps its parameters."""
    path = tmp_path / "bad.safetensors"
    path.write_bytes(contents(tmp_path, rng))
    with pytest.raises(ValueError, match="not a safetensors file"):
        checkpoint.load(path)
    net = mlp(NumpyHandler(np.float32))
    before = bits(net.h, net.params)
    with pytest.raises(ValueError):
        net.load(path)
    assert bits(net.h, net.params) == before


def test_file_of_a_newer_format_is_a_value_error(tmp_path):
    """A header of a later format version is refused, not misread."""
    path = tmp_path / "new.safetensors"
    save_file({"x": np.zeros(3, np.float32)}, str(path),
              metadata={"streamhandlers": json.dumps({"version": 99, "values": {}})})
    with pytest.raises(ValueError, match="newer"):
        checkpoint.load(path)


def test_bfloat16_network_round_trips_its_bf16_arrays(tmp_path, rng):
    """A bfloat16 network (not mixed precision) saves BF16 tensors, which
    load bit for bit into another, exactly into float32; a float32 file
    loads into it only with cast=True, rounded to bfloat16."""
    src = mlp(NumpyHandler("bfloat16"), seed=1)
    want = randomize(src, rng)
    path = tmp_path / "bf16.safetensors"
    src.save(path)
    with safe_open(str(path), framework="numpy") as f:
        assert {f.get_slice(name).get_dtype() for name in f.keys()} == {"BF16"}
    loaded = checkpoint.load(path)
    assert {a.dtype for a in loaded.values()} == {src.h.dtype}
    assert_values(loaded, want, "checkpoint.load")

    dst = mlp(NumpyHandler("bfloat16"), seed=2)
    dst.load(path)
    held, source = view_values(dst), view_values(src)
    for name in want:
        assert held[name].tobytes() == source[name].tobytes(), name
    wide = mlp(NumpyHandler(np.float32), seed=3)
    wide.load(path)
    assert_values(view_values(wide), want, "bf16 -> f32")

    f32 = mlp(NumpyHandler(np.float32), seed=4)
    want32 = randomize(f32, rng)
    f32.save(path)
    before = bits(dst.h, dst.params)
    with pytest.raises(ValueError, match="cast=True"):
        dst.load(path)
    assert bits(dst.h, dst.params) == before
    dst.load(path, cast=True)
    assert_values(view_values(dst), {k: as_handler_values(dst.h, v) for k, v in want32.items()},
                  "f32 -> bf16, cast")


# ============================================================================ 5. atomic save
_STALLED_SAVE = """
import os, sys, time
import numpy as np
from layers import checkpoint
path, marker, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
a = {"x": rng.standard_normal(1000), "which": "A"}
b = {"x": rng.standard_normal(1_000_000), "y": rng.standard_normal(10), "which": "B"}
checkpoint.save(path, a)
def stall(fd):
    open(marker, "w").close()
    time.sleep(600)
os.fsync = stall
checkpoint.save(path, b)
"""

_SAVE_LOOP = """
import sys
import numpy as np
from layers import checkpoint
path, ready, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
states = [{"x": rng.standard_normal(2_500_000), "which": which} for which in (0, 1)]
checkpoint.save(path, states[0])
open(ready, "w").close()
i = 1
while True:
    checkpoint.save(path, states[i % 2])
    i += 1
"""


def _child(script, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(marker, child, timeout=60.0):
    """Wait until the child has made ``marker``; fail with its output if it
    ended first."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"the child ended (status {child.returncode}) before {marker.name}:\n"
                        f"{err.decode()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {marker.name} after {timeout} s")
        time.sleep(0.01)


def _kill(child):
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
    child.communicate()


def test_save_killed_before_the_rename_leaves_the_old_file(tmp_path, rng):
    """A child saves A, then is killed inside the save of a larger B (its
    fsync stalled): the file still loads and is A, exactly."""
    seed = int(rng.integers(2**31))
    target, marker = tmp_path / "ckpt.safetensors", tmp_path / "in-fsync"
    child = _child(_STALLED_SAVE, target, marker, seed)
    try:
        _wait_for(marker, child)
    finally:
        _kill(child)
    assert child.returncode == -signal.SIGKILL
    a = np.random.default_rng(seed).standard_normal(1000)
    got = checkpoint.load(target)
    assert set(got) == {"x", "which"} and got["which"] == "A"
    assert got["x"].tobytes() == a.tobytes()


def test_save_killed_at_random_leaves_a_whole_file(tmp_path, rng):
    """A child saves two ~20 MB states in turn, over and over; killed at a
    random moment, it leaves one of them, whole."""
    seed = int(rng.integers(2**31))
    gen = np.random.default_rng(seed)
    states = [gen.standard_normal(2_500_000) for _ in range(2)]
    target = tmp_path / "ckpt.safetensors"
    for delay in rng.uniform(0.0, 0.4, 5):
        ready = tmp_path / "ready"
        ready.unlink(missing_ok=True)
        child = _child(_SAVE_LOOP, target, ready, seed)
        try:
            _wait_for(ready, child)
            time.sleep(delay)
        finally:
            _kill(child)
        assert child.returncode == -signal.SIGKILL
        got = checkpoint.load(target)
        assert set(got) == {"x", "which"} and got["which"] in (0, 1)
        assert got["x"].tobytes() == states[got["which"]].tobytes()
    for leftover in tmp_path.glob("*.tmp"):
        leftover.unlink()


# ============================================================================ 6. copies
def _sequential(h):
    return mlp(h)


def _bound_layer(h):
    return mlp(h).layers[2]


def _sgd(h):
    return SGD(mlp(h).parameters)


def _adam(h):
    return Adam(mlp(h).parameters)


def _loss_scaler(h):
    net = mlp(h)
    net.mixed_precision("float16")
    return net.loss_scaler


def _trainer(h):
    net = mlp(h)
    return Trainer(net, SGD(net.parameters), progress=False)


def _data_parallel(h):
    return DataParallel(mlp(h))


@pytest.mark.parametrize("make", [_sequential, _bound_layer, _sgd, _adam, _loss_scaler,
                                  _trainer, _data_parallel], ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("how", [pickle.dumps, copy.copy, copy.deepcopy],
                         ids=["pickle", "copy", "deepcopy"])
def test_objects_with_shared_buffers_refuse_copies(make, how):
    """pickle, copy and deepcopy raise TypeError pointing to state_dict."""
    obj = make(NumpyHandler(np.float32))
    assert isinstance(obj, (Sequential, FullyConnected, SGD, Adam, LossScaler, Trainer,
                            DataParallel))
    with pytest.raises(TypeError, match="state_dict"):
        how(obj)


def test_unbound_layer_copies_freely(rng):
    """Before any network a layer copies (and pickles); the copy is its own:
    binding it leaves the original unbound and still copyable."""
    layer = FullyConnected(3, 4)
    twin = copy.deepcopy(layer)
    assert twin is not layer and (twin.n_in, twin.n_out) == (3, 4)
    restored = pickle.loads(pickle.dumps(LSTM(2, 5)))
    assert (restored.n_in, restored.n_hidden) == (2, 5)
    h = NumpyHandler(np.float64)
    net = Sequential(h, [twin], SquaredError(), seed=1)
    assert twin.params and layer.h is None and layer.params == {}
    copy.deepcopy(layer)
    with pytest.raises(TypeError, match="state_dict"):
        copy.deepcopy(twin)
    other = Sequential(h, [layer], SquaredError(), seed=2)
    x = h.create_from_numpy(rand((5, 3), rng))
    assert not np.array_equal(h.get_numpy_copy(net.forward(x)),
                              h.get_numpy_copy(other.forward(x)))


# ============================================================================ 7. random states
def _draw(h, n=257):
    """(gaussians, mask) from ``h``'s generator, as host copies."""
    g, m = h.zeros((n,)), h.zeros((n,))
    h.fill_gaussian(0.0, 1.0, g)
    h.generate_probability_mask(m, 0.5)
    return h.get_numpy_copy(g), h.get_numpy_copy(m)


def assert_same_draws(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_random_state_restores_the_draws(make_handler, handler_id):
    """The draws after ``set_random_state(s)`` repeat those after ``s =
    random_state()``; the state is plain JSON; a handler of another seed
    given the state draws the same too."""
    h = make_handler(handler_id, seed=11)
    _draw(h)
    s = h.random_state()
    assert json.loads(json.dumps(s)) == s and "generator" in s
    first, second = _draw(h), _draw(h)
    assert h.random_state() != s
    assert not np.array_equal(first[0], second[0])
    h.set_random_state(s)
    assert h.random_state() == s
    assert_same_draws(_draw(h), first)
    assert_same_draws(_draw(h), second)
    other = make_handler(handler_id, seed=12)
    assert other.random_state() != s
    other.set_random_state(json.loads(json.dumps(s)))
    assert_same_draws(_draw(other), first)


def test_views_and_twins_share_the_random_state(make_handler, handler_id):
    """A stream-group view and a bfloat16 twin read and set the handler's
    state; a draw on either advances it."""
    h = make_handler(handler_id, seed=5)
    view, twin = h.with_streams(1), h.twin("bfloat16")
    s0 = h.random_state()
    assert view.random_state() == s0 and twin.random_state() == s0
    first = _draw(h)
    h.set_random_state(s0)
    assert_same_draws(_draw(view), first)                 # the view draws the same values
    assert h.random_state() != s0
    twin.set_random_state(s0)                             # set through the twin
    assert h.random_state() == s0
    _draw(twin)
    s1 = h.random_state()
    assert s1 != s0 and twin.random_state() == s1 and view.random_state() == s1
    after_twin = _draw(h)
    assert not np.array_equal(after_twin[0], first[0])
    h.set_random_state(s1)
    assert_same_draws(_draw(h), after_twin)


def test_debug_handler_forwards_the_random_state():
    inner = NumpyHandler(np.float32, seed=3)
    d = DebugHandler(inner)
    s = d.random_state()
    assert s == inner.random_state()
    first = _draw(inner)
    d.set_random_state(s)
    assert inner.random_state() == s
    assert_same_draws(_draw(inner), first)


@pytest.mark.parametrize("bad", [{"generator": "other"}, {}, "state", None], ids=repr)
def test_state_of_another_generator_changes_nothing(make_handler, handler_id, bad):
    """A state of another generator (or no state at all) is a ValueError;
    the state and the next draws are as before."""
    h = make_handler(handler_id, seed=7)
    s = h.random_state()
    want = _draw(h)
    h.set_random_state(s)
    with pytest.raises(ValueError, match="set_random_state"):
        h.set_random_state(bad)
    assert h.random_state() == s
    assert_same_draws(_draw(h), want)


def test_random_state_refused_inside_a_capture(make_handler, handler_id):
    """random_state and set_random_state, of the handler or its twin, raise
    CaptureError inside a capture; the state and the handler are unharmed."""
    h = make_handler(handler_id, seed=9)
    twin = h.twin("float32" if h.dtype == np.float64 else "float64")
    s = h.random_state()
    want = _draw(h)
    h.set_random_state(s)
    for call in (h.random_state, twin.random_state, lambda: h.set_random_state(s),
                 lambda: twin.set_random_state(s)):
        with pytest.raises(CaptureError, match="random_state"):
            h.capture(call)
    with pytest.raises(CaptureError, match="random_state"):
        with h.capture():
            h.random_state()
    assert h.random_state() == s
    assert_same_draws(_draw(h), want)
