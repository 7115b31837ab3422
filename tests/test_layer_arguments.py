"""Layers and the loss scaler refuse bad arguments at construction, naming
themselves and the argument: TypeError for a value that is not a number,
ValueError for NaN, inf or a number out of range."""
import math

import pytest

from layers import Dropout, LayerNorm, LossScaler
from test_mixed_precision import _mlp

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("make,exc,words", [
    (lambda: LayerNorm(4, eps="1e-5"), TypeError, "LayerNorm: eps must be a real number"),
    (lambda: LayerNorm(4, eps=None), TypeError, "LayerNorm: eps must be a real number"),
    (lambda: LayerNorm(4, eps=NAN), ValueError, "LayerNorm: eps must be finite and > 0"),
    (lambda: LayerNorm(4, eps=INF), ValueError, "LayerNorm: eps must be finite and > 0"),
    (lambda: LayerNorm("4"), TypeError, "LayerNorm: d must be an int"),
    (lambda: LayerNorm(4.5), TypeError, "LayerNorm: d must be an int"),
    (lambda: Dropout(None), TypeError, "Dropout: p must be a real number"),
    (lambda: Dropout("0.5"), TypeError, "Dropout: p must be a real number"),
    (lambda: Dropout(NAN), ValueError, "Dropout: p must be in"),
], ids=["ln-eps-str", "ln-eps-None", "ln-eps-nan", "ln-eps-inf", "ln-d-str", "ln-d-float",
        "dropout-None", "dropout-str", "dropout-nan"])
def test_layer_arguments_are_checked(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    assert info.type is exc and words in str(info.value), str(info.value)


@pytest.mark.parametrize("kw,exc", [
    ({"init_scale": None}, TypeError), ({"init_scale": "8"}, TypeError),
    ({"init_scale": NAN}, ValueError), ({"max_scale": NAN}, ValueError),
    ({"max_scale": None}, TypeError), ({"interval": NAN}, ValueError),
], ids=["init-None", "init-str", "init-nan", "max-nan", "max-None", "interval-nan"])
def test_loss_scaler_arguments_are_checked(make_handler, handler_id, kw, exc):
    net = _mlp(make_handler(handler_id, seed=0))
    net.mixed_precision("float16")
    with pytest.raises(exc) as info:
        LossScaler(net, **kw)
    assert info.type is exc and "LossScaler:" in str(info.value) and next(iter(kw)) in str(
        info.value), str(info.value)
