"""Keeping torch's compiler stack out of a training process that never compiles.

Three eager calls the trainer makes import torch._dynamo (and with
`use_deterministic_algorithms`, torch._inductor) although nothing is compiled:

* `torch.use_deterministic_algorithms` imports torch._inductor.config to set
  inductor's own flag;
* `Optimizer.add_param_group`, `zero_grad`, `state_dict` and `load_state_dict`
  are wrapped by `torch._disable_dynamo`, which imports torch._dynamo on the
  first call to build the "disabled" version of the function;
* `Optimizer.step` is wrapped by a grad-mode helper that imports torch._dynamo
  on every call for two graph breaks (no-ops outside compilation).

On the 2-core machine importing torch._dynamo costs about as much CPU as
importing torch itself (~2 s each under load) and more than a CartPole run
trains: most of the gap between `peregrine train cartpole` and its training
time (benchmarks/bench_cold_start.py).

The functions below do the same eager work without the import while
torch._dynamo is not loaded. Once it is loaded (someone compiles in this
process) every path goes back to torch's own, so compiled code sees exactly
what torch intends. Each looks for the torch internals it relies on and, when
they are not there (another torch version), uses the public call: an upgrade
can cost start-up time, never correctness.
"""
from __future__ import annotations

import inspect
import sys

import torch

DYNAMO = "torch._dynamo"


def use_deterministic_algorithms() -> None:
    """torch.use_deterministic_algorithms(True, warn_only=True) for eager code.

    The public call also sets torch._inductor.config.deterministic, importing
    the compiler; that flag matters only to compiled code, so it is set through
    the public call only when inductor is already loaded.
    """
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        setter(True, warn_only=True)


def _disable_dynamo_code():
    """The code object of the wrapper `torch._disable_dynamo` puts on a function."""
    disable = getattr(torch, "_disable_dynamo", None)
    if disable is None:
        return None
    return getattr(disable(lambda: None), "__code__", None)


def _deferred_disable(function, recursive):
    """What torch caches as the function's "disabled" version: the function
    itself while torch._dynamo is not loaded (nothing can be tracing it), torch's
    real `torch._dynamo.disable(...)` from the first call after it is loaded."""
    def call(*args, **kwargs):
        if DYNAMO in sys.modules:
            disabled = sys.modules[DYNAMO].disable(function, recursive, wrapping=False)
            setattr(function, "__dynamo_disable", disabled)
            return disabled(*args, **kwargs)
        return function(*args, **kwargs)
    return call


def defer_dynamo_in_optimizer(optimizer_class: type) -> int:
    """Makes the `torch._disable_dynamo` wrappers of an optimizer class (and its
    bases) import nothing until torch._dynamo is loaded; call it before
    constructing the optimizer. Returns how many methods were changed (0 when
    torch's wrappers look different or were changed before)."""
    code = _disable_dynamo_code()
    if code is None or DYNAMO in sys.modules:
        return 0
    changed = 0
    for cls in optimizer_class.__mro__:
        for attribute in vars(cls).values():
            if getattr(attribute, "__code__", None) is not code:
                continue
            function = getattr(attribute, "__wrapped__", None)
            if function is None or hasattr(function, "__dynamo_disable"):
                continue
            recursive = inspect.getclosurevars(attribute).nonlocals.get("recursive", True)
            setattr(function, "__dynamo_disable", _deferred_disable(function, recursive))
            changed += 1
    return changed


def _unwrapped_step(optimizer):
    """The optimizer's own `step` body under torch's wrappers (the step-hook
    wrapper and the grad-mode wrapper), or None if they are not as expected."""
    step = type(optimizer).step
    while hasattr(step, "__wrapped__"):
        if getattr(step, "__code__", None) is not None and step.__code__.co_name == "_use_grad":
            return step.__wrapped__
        step = step.__wrapped__
    return None


def _has_step_hooks(optimizer) -> bool:
    from torch.optim import optimizer as optimizer_module
    return bool(getattr(optimizer, "_optimizer_step_pre_hooks", None)
                or getattr(optimizer, "_optimizer_step_post_hooks", None)
                or getattr(optimizer_module, "_global_optimizer_pre_hooks", None)
                or getattr(optimizer_module, "_global_optimizer_post_hooks", None))


def step_function(optimizer: torch.optim.Optimizer):
    """A callable equivalent to `optimizer.step()` in eager mode.

    While torch._dynamo is not loaded and no step hooks are registered, it runs
    the optimizer's own step body with grad mode set as torch's wrapper sets it
    (the wrapper's graph breaks do nothing outside compilation); otherwise it is
    `optimizer.step()`.
    """
    body = _unwrapped_step(optimizer)
    if body is None or "differentiable" not in optimizer.defaults:
        return optimizer.step

    def step():
        if DYNAMO in sys.modules or _has_step_hooks(optimizer):
            return optimizer.step()
        with torch.set_grad_enabled(bool(optimizer.defaults["differentiable"])):
            return body(optimizer)
    return step
