"""The environment suite and everything every env shares.

Folders: one per env (its C header, NumPy reference, Python class, scripted
baselines, renderer); `native/` (the C contract and the native batch's Python
face, `NativeEnv`); `gpu/` (the NVRTC compiler and the device batch,
`DeviceEnv`); `reference/` (what the NumPy references share). At this root:
`registry` (env names, `make`, the Gymnasium ids), `check` (the env contract
checker, `check_env`) and `scripted` (the scripted-policy catalogue).

Names load on first use, so `import peregrine` stays light.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .check import EnvContractError, check_env
    from .registry import load
    from .sdk import NativeBuildError, get_include
    from .gpu.batch import DeviceEnv
    from .native.batch import NativeEnv

_LAZY = {
    "check_env": "check", "EnvContractError": "check",
    "NativeEnv": "native.batch", "DeviceEnv": "gpu.batch",
    "load": "registry", "get_include": "sdk", "NativeBuildError": "sdk",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
