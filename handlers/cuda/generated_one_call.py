"""PyCudaHandler's one-call ops (``handlers.cuda.one_call``): OneCall first,
the contract's method when it declines.

Written by ``python -m handlers.generate``: do not edit by hand.
"""
from ..base import Handler


def add_tt(self, a, b, out):
    if not self._one_call.run(0, a, b, out):
        Handler.add_tt(self, a, b, out)


def subtract_tt(self, a, b, out):
    if not self._one_call.run(1, a, b, out):
        Handler.subtract_tt(self, a, b, out)


def mult_tt(self, a, b, out):
    if not self._one_call.run(2, a, b, out):
        Handler.mult_tt(self, a, b, out)


def divide_tt(self, a, b, out):
    if not self._one_call.run(3, a, b, out):
        Handler.divide_tt(self, a, b, out)


def mult_add_tt(self, a, b, out):
    if not self._one_call.run(4, a, b, out):
        Handler.mult_add_tt(self, a, b, out)


def maximum_tt(self, a, b, out):
    if not self._one_call.run(5, a, b, out):
        Handler.maximum_tt(self, a, b, out)


def minimum_tt(self, a, b, out):
    if not self._one_call.run(6, a, b, out):
        Handler.minimum_tt(self, a, b, out)


def greater_tt(self, a, b, out):
    if not self._one_call.run(7, a, b, out):
        Handler.greater_tt(self, a, b, out)


def equal_tt(self, a, b, out):
    if not self._one_call.run(8, a, b, out):
        Handler.equal_tt(self, a, b, out)


def add_st(self, s, t, out):
    if not self._one_call.scalar(9, s, t, out):
        Handler.add_st(self, s, t, out)


def mult_st(self, s, t, out):
    if not self._one_call.scalar(10, s, t, out):
        Handler.mult_st(self, s, t, out)


def mult_add_st(self, s, t, out):
    if not self._one_call.scalar(11, s, t, out):
        Handler.mult_add_st(self, s, t, out)


def pow_st(self, s, t, out):
    if not self._one_call.scalar(12, s, t, out):
        Handler.pow_st(self, s, t, out)


def where_t(self, cond, a, b, out):
    if not self._one_call.run(13, cond, a, b, out):
        Handler.where_t(self, cond, a, b, out)


def abs_t(self, a, out):
    if not self._one_call.run(14, a, out):
        Handler.abs_t(self, a, out)


def sign_t(self, a, out):
    if not self._one_call.run(15, a, out):
        Handler.sign_t(self, a, out)


def square_t(self, a, out):
    if not self._one_call.run(16, a, out):
        Handler.square_t(self, a, out)


def sqrt_t(self, a, out):
    if not self._one_call.run(17, a, out):
        Handler.sqrt_t(self, a, out)


def rsqrt_t(self, a, out):
    if not self._one_call.run(18, a, out):
        Handler.rsqrt_t(self, a, out)


def log_t(self, a, out):
    if not self._one_call.run(19, a, out):
        Handler.log_t(self, a, out)


def exp_t(self, a, out):
    if not self._one_call.run(20, a, out):
        Handler.exp_t(self, a, out)


def sigmoid(self, x, y):
    if not self._one_call.run(21, x, y):
        Handler.sigmoid(self, x, y)


def tanh(self, x, y):
    if not self._one_call.run(22, x, y):
        Handler.tanh(self, x, y)


def relu(self, x, y):
    if not self._one_call.run(23, x, y):
        Handler.relu(self, x, y)


def elu(self, x, y):
    if not self._one_call.run(24, x, y):
        Handler.elu(self, x, y)


def sigmoid_deriv(self, x, y, dy, dx):
    if not self._one_call.run(25, x, y, dy, dx):
        Handler.sigmoid_deriv(self, x, y, dy, dx)


def tanh_deriv(self, x, y, dy, dx):
    if not self._one_call.run(26, x, y, dy, dx):
        Handler.tanh_deriv(self, x, y, dy, dx)


def relu_deriv(self, x, y, dy, dx):
    if not self._one_call.run(27, x, y, dy, dx):
        Handler.relu_deriv(self, x, y, dy, dx)


def elu_deriv(self, x, y, dy, dx):
    if not self._one_call.run(28, x, y, dy, dx):
        Handler.elu_deriv(self, x, y, dy, dx)


def copy_to_if(self, src, dest, cond):
    if not self._one_call.run(29, src, dest, cond):
        Handler.copy_to_if(self, src, dest, cond)


def add_into_if(self, a, out, cond):
    if not self._one_call.run(30, a, out, cond):
        Handler.add_into_if(self, a, out, cond)


def axpby(self, alpha, x, beta, y):
    if not self._one_call.axpby(31, alpha, x, beta, y):
        Handler.axpby(self, alpha, x, beta, y)


def dot_mm(self, a, b, out, transa=False, transb=False):
    if not self._one_call.dot(a, b, out, transa, transb, 0.0):
        Handler.dot_mm(self, a, b, out, transa, transb)


def dot_add_mm(self, a, b, out, transa=False, transb=False):
    if not self._one_call.dot(a, b, out, transa, transb, 1.0):
        Handler.dot_add_mm(self, a, b, out, transa, transb)
