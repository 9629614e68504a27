"""The model's weights as a state: a key that changes whenever any weight does, and the check that they are finite.

Anything computed from the weights (the fast path's rearranged copies, the finite-weights check) is
kept with the key it was computed for and recomputed when the key changes.
"""
from __future__ import annotations

import threading
import weakref

import torch
import torch.nn as nn


def weights_key(module: nn.Module) -> tuple:
    """What changes when any weight of ``module`` does: each parameter's and buffer's identity, version and memory.

    ``tensor._version`` counts in-place writes (an optimiser step, ``load_state_dict``, ``mul_`` under
    ``no_grad``); ``id`` changes when a tensor is replaced, its memory when ``model.double()`` or ``.to``
    converts it in place. Anything computed from the weights (the fast path's copies, the finite-weights
    check) is stale when this key changes. Writes through ``.data`` are the one blind spot: PyTorch does
    not count them, so edit weights under ``torch.no_grad()`` instead. The list of tensors is
    kept between calls (walking the module tree costs more than a decode step's bookkeeping) and
    walked again whenever any module anywhere gains or replaces a parameter, buffer or submodule.
    """
    _install_hooks()
    hit = _weights.get(module)
    if hit is None or hit[0] != _registrations[0]:
        hit = _weights[module] = (_registrations[0], (*module.parameters(), *module.buffers()))
    return tuple((id(t), t._version, t.data_ptr()) for t in hit[1])


_weights: "weakref.WeakKeyDictionary[nn.Module, tuple[int, tuple]]" = weakref.WeakKeyDictionary()
_registrations = [0]  # bumped by every parameter, buffer or submodule registration, in any module


def _registered(*args) -> None:
    _registrations[0] += 1


def _install_hooks() -> None:
    """Count every registration from the first call on (before it, nothing was cached that could be stale)."""
    if not _installed:
        with _installing:
            if not _installed:
                for hook in (nn.modules.module.register_module_parameter_registration_hook,
                             nn.modules.module.register_module_buffer_registration_hook,
                             nn.modules.module.register_module_module_registration_hook):
                    hook(_registered)
                _installed.append(True)


_installed: list[bool] = []
_installing = threading.Lock()


_FINITE_STATES = weakref.WeakKeyDictionary()  # model -> the weights' (id, version) when last found finite


def check_weights(model) -> None:
    """Every parameter and buffer of ``model`` is finite; the first one that is not is named.

    The scan runs once per state of the weights: in-place writes (an optimiser step,
    ``load_state_dict``, an edit under ``no_grad``) bump a tensor's version counter and so rescan.
    """
    named = [*model.named_parameters(), *model.named_buffers()]
    state = weights_key(model)
    if _FINITE_STATES.get(model) == state:
        return
    for name, t in named:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"model weight {name} holds {bad} non-finite value(s) (NaN or inf) of "
                             f"{t.numel()}: the model cannot produce meaningful logits; allowed are finite weights "
                             f"(reload the checkpoint, or retrain with a lower learning rate)")
    _FINITE_STATES[model] = state
