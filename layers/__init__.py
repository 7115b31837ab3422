"""Layers, the network container, the optimizer and the trainer.

Layers are written only against the handler API: no NumPy math and no pycuda
import here (NumPy appears only for dtypes, shapes and initial host data), so
every layer runs unchanged on every handler.  Usage::

    from handlers import NumpyHandler
    from layers import LSTM, FullyConnected, SoftmaxCrossEntropy, Sequential, SGD, Trainer

    h = NumpyHandler()
    net = Sequential(h, [LSTM(8, 64, return_sequences=False), FullyConnected(64, 10)],
                     SoftmaxCrossEntropy(), seed=0)
    history = Trainer(net, SGD(net.parameters, lr=0.1), batch_axis=1).fit(x, y, epochs=10)
"""
from .activations import ELU, GELU, Activation, ReLU, Sigmoid, SiLU, Tanh
from .base import Layer
from .compose import Add, Chain, Concat, Graph, Merge, Residual
from .conv import AvgPool2D, Conv2D, MaxPool2D
from .dense import FullyConnected
from .dropout import Dropout
from .embedding import Embedding
from .flatten import Flatten
from .layernorm import LayerNorm
from .loss_scale import LossScaler
from .losses import Loss, SoftmaxCrossEntropy, SquaredError
from .lstm import LSTM
from .metrics import DeviceAccuracy, accuracy
from .network import Sequential
from .optim import SGD, Adam, AdamW
from .params import ParameterSet, view
from .trainer import History, NonFiniteLossError, Trainer
from .transformer import MultiHeadAttention, PositionEmbedding, Reshape, RMSNorm

__all__ = ["Layer", "Activation", "Sigmoid", "Tanh", "ReLU", "ELU", "GELU", "SiLU",
           "FullyConnected",
           "Dropout", "Embedding", "Flatten", "LayerNorm", "Loss", "SoftmaxCrossEntropy",
           "SquaredError", "LSTM", "Sequential",
           "SGD", "Adam", "AdamW", "Trainer", "History", "NonFiniteLossError", "ParameterSet",
           "view", "accuracy", "DeviceAccuracy",
           "Conv2D", "MaxPool2D", "AvgPool2D", "LossScaler",
           "Chain", "Residual", "Graph", "Merge", "Add", "Concat",
           "MultiHeadAttention", "RMSNorm", "PositionEmbedding", "Reshape"]
