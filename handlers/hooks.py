"""The backend hooks, in one table: the methods through which the contract's
public ops (``handlers.base.Handler``) reach a backend.

Each hook has a kind, and every list that other modules need is derived
from this table, never written out again:

* ``"work"``: issues work on the handler's stream group.  A capture shadows
  these and records their calls (``handlers.graphs``), NumpyHandler runs them
  in float32 for the half formats, PyCudaHandler holds the group's stream
  lock around them, and a closed handler refuses them.
* ``"order"``: orders stream groups or waits for them.
* ``"host"``: host work and memory: allocation, transfers, host reads,
  views, twins.

``abstract`` hooks are declared abstract on ``Handler`` (every backend
writes them); the others have a default in ``Handler`` that a backend may
replace.  A new hook is one row here; its kind decides the rest.
"""

#: name -> (kind, abstract, what it does)
HOOKS = {
    "_record_event": ("order", True, "An event recorded on this group."),
    "_wait_event": ("order", True, "Make this group wait for an event."),
    "_synchronize": ("order", True, "Wait on the host for this group."),
    "_synchronize_all": ("order", True, "Wait on the host for every group."),
    "_wait_for": ("order", False, "Make this group wait for another handler's group."),
    "_transfer": ("host", True, "A prefetch.Transfer for this handler."),
    "_pin": ("host", True, "Page-lock a host array (pin)."),
    "_empty_pinned": ("host", True, "A page-locked host array (empty_pinned)."),
    "_copy_async": ("host", True, "get_numpy_copy_async's work."),
    "_allocate": ("host", True, "A new array of a checked shape."),
    "_set_from_numpy": ("host", True, "Copy a host array in."),
    "_wrap": ("host", True, "create_from_device_array's work."),
    "_get_numpy_copy": ("host", True, "get_numpy_copy's work."),
    "_is_fully_finite": ("host", True, "is_fully_finite's work (a host read)."),
    "_view": ("host", False, "view_t's and reshape_t's work."),
    "_make_twin": ("host", False, "A handler of another format on this one's streams."),
    "_bind_fused": ("host", False, "FusedOp.bind's work: the checks, then a call of _fused."),
    "_mean_t": ("host", False, "mean_t's work, through _sum_t (and _elementwise)."),
    "_random_state": ("host", False, "random_state's work: the generator's state."),
    "_set_random_state": ("host", False, "set_random_state's work, on a checked state."),
    "_fill": ("work", True, "Set every element to a value."),
    "_copy_to": ("work", True, "copy_to's work."),
    "_cast_t": ("work", True, "cast_t's work: (src, dst), src of any format the class holds."),
    "_dot": ("work", True, "dot_mm (beta 0) and dot_add_mm (beta 1)."),
    "_dot_bias_act": ("work", False, "dot_bias_act's work: by default the product (_dot), "
                                     "then its epilogue, a fused op (_fused)."),
    "_conv2d_bias_act": ("work", False, "conv2d_bias_act's work: by default the forward "
                                        "convolution (_conv2d), then its epilogue, a fused "
                                        "op (_fused) per image."),
    "_attention_forward": ("work", False, "attention_forward's work: by default batched "
                                          "products and fused row programs "
                                          "(handlers.attention)."),
    "_attention_backward": ("work", False, "attention_backward's work: by default as the "
                                           "forward's (handlers.attention)."),
    "_axpby": ("work", True, "axpby's work."),
    "_sum_t": ("work", True, "sum_t's work, over a checked axis (None, an int or a sorted "
                             "tuple)."),
    "_extreme_t": ("work", True, "max_t, min_t, argmax_t (kind 'max', 'min', 'argmax') over "
                                 "one axis."),
    "_elementwise": ("work", False, "An elementwise op of the table: (op, *args)."),
    "_adam_update": ("work", True, "adam_update's work (one fused pass; advances step on the "
                                   "device)."),
    "_scale_finite": ("work", True, "scale_finite_t's work: (a, factor, flag)."),
    "_update_loss_scale": ("work", True, "update_loss_scale's work: (flag, state, interval, "
                                         "max_scale)."),
    "_broadcast_t": ("work", True, "broadcast_t's work."),
    "_mv": ("work", True, "The *_mv ops."),
    "_index_m_by_v": ("work", True, "index_m_by_v's work."),
    "_binarize_v": ("work", True, "binarize_v's work."),
    "_gather_rows": ("work", True, "gather_rows_m's work (invalid indices: see its "
                                   "docstring)."),
    "_scatter_add_rows": ("work", True, "scatter_add_rows_m's work, in index order "
                                        "(deterministic)."),
    "_transpose_m": ("work", True, "transpose_m's work."),
    "_permute_t": ("work", True, "permute_t's work, with checked axes (a tuple)."),
    "_concat_t": ("work", True, "concat_t's work, along a checked axis."),
    "_split_t": ("work", True, "split_t's work, along a checked axis."),
    "_fill_gaussian": ("work", True, "fill_gaussian's work."),
    "_probability_mask": ("work", True, "generate_probability_mask's work."),
    "_conv2d": ("work", True, "The conv2d ops (kind 'forward', 'backward_data', "
                              "'backward_filter'), with stride, padding and dilation as "
                              "checked pairs."),
    "_pool2d": ("work", True, "The pooling ops (kind 'max', 'avg', 'max_backward', "
                              "'avg_backward'): (kind, src, dst, argmax or None, window, "
                              "stride, padding), pairs checked."),
    "_fused": ("work", True, "A user-defined fused op's work: (op, *args), op a "
                             "handlers.fused.FusedOp and args its parameters in order, "
                             "scalars as floats or device scalars."),
}

#: The hooks that issue work (a capture records them)
WORK = tuple(name for name, (kind, _, _) in HOOKS.items() if kind == "work")
#: The hooks ``Handler`` declares abstract: (name, what it does)
ABSTRACT = tuple((name, doc) for name, (_, abstract, doc) in HOOKS.items() if abstract)
#: Hooks whose first argument names the op: an op-table row or a fused declaration
NAMED_BY_FIRST = frozenset({"_elementwise", "_fused", "_bind_fused"})
