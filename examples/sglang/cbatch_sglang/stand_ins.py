"""Import-time stand-ins that let SGLang's scheduler modules import on a CPU-only machine.

SGLang 0.5.23 imports triton at module level (``sglang/srt/utils/common.py``) and, through
``schedule_batch`` -> ``sglang.srt.configs`` -> ``multimodal/internvl_utils.py``, torchvision.
Neither is used by the scheduler: triton only decorates GPU kernels, torchvision only
preprocesses images.  The triton stand-in is SGLang's own (``sglang/_platform_stubs.py``,
which SGLang installs itself on macOS); torchvision gets inert modules built the same way.

Call :func:`install` before the first ``import sglang``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from types import ModuleType
from unittest import mock

__all__ = ["install"]

_TORCHVISION_MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                        "torchvision.transforms.v2", "torchvision.transforms.v2.functional")
_installed = False


def _sglang_platform_stubs() -> ModuleType:
    # Loaded by path: importing the ``sglang`` package itself already needs triton.
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "_platform_stubs.py")
    stub_spec = importlib.util.spec_from_file_location("_cbatch_sglang_platform_stubs", path)
    if stub_spec is None or stub_spec.loader is None:
        raise ImportError(f"sglang has no platform stubs at {path}")
    module = importlib.util.module_from_spec(stub_spec)
    sys.modules[stub_spec.name] = module
    stub_spec.loader.exec_module(module)
    return module


def install() -> None:
    """Install the triton and torchvision stand-ins (idempotent; no-op for a real package)."""
    global _installed
    if _installed:
        return
    import torch
    # transformers caches whether torchvision exists; it must look before any stand-in does,
    # or transformers/image_utils.py fails on a missing NEAREST_EXACT.
    from transformers.utils import import_utils
    has_torchvision = import_utils.is_torchvision_available()
    stubs = _sglang_platform_stubs()
    if importlib.util.find_spec("triton") is None:
        # install_platform_stubs() acts only on Apple Silicon with MPS; it is the triton part we want.
        with mock.patch.object(sys, "platform", "darwin"), \
                mock.patch.object(platform, "machine", lambda: "arm64"), \
                mock.patch.object(torch.backends.mps, "is_available", lambda: True):
            stubs.install_platform_stubs()
    if not has_torchvision:
        for name in _TORCHVISION_MODULES:
            stubs._make_mock(name)
    _installed = True
