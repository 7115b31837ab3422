"""Per-handler tests of the package, with streamhandlers' test kit: the
``handler`` and ``rng`` fixtures come from its pytest plugin."""
import numpy as np
from mylayers import FeatureAffine, swish

from handlers.testing import assert_close, check_fused_op, check_layer_gradients


def test_feature_affine_gradients(handler, rng):
    check_layer_gradients(handler, FeatureAffine(6), (5, 6), rng, params="random")


def test_feature_affine_forward(handler, rng):
    layer = FeatureAffine(3)
    check_layer_gradients(handler, layer, (4, 3), rng)   # binds it to handler
    x = rng.uniform(-1, 1, (4, 3))
    y = layer.forward(handler.create_from_numpy(x))
    w = handler.get_numpy_copy(layer.params["w"]).astype(np.float64)
    b = handler.get_numpy_copy(layer.params["b"]).astype(np.float64)
    x = np.asarray(x, handler.dtype).astype(np.float64)
    assert_close(handler, y, x * w + b)


def test_swish(handler, rng):
    check_fused_op(handler, swish, lambda x: x / (1 + np.exp(-x)), (7, 33), rng, low=-4, high=4)
