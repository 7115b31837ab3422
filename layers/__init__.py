"""Layers, the network container and the trainer (they come later).

Layers are written only against the handler API: no NumPy math and no pycuda
import here, so every layer runs unchanged on every handler.
"""
