"""Lets transformers' GGUF tokenizer conversion import without PyTorch.

transformers' `integrations.gguf` package imports torch at module level for
its model-loading helpers; the tokenizer conversion and the tensor processors
the tests use never call it. The reference environment (.deps/venv) has no
torch, so a permissive stand-in module is installed before the import. It is
only used when the real torch is missing.
"""

import importlib.util
import sys
import types


class _Any:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Any()

    def __getattr__(self, name):
        return _Any()

    def __or__(self, other):
        return self

    def __ror__(self, other):
        return self

    def __getitem__(self, key):
        return self


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Any,), {})


def install():
    if importlib.util.find_spec("torch") is not None or "torch" in sys.modules:
        return
    # transformers probes for torch (find_spec) while it initializes: let it
    # see none first, then put the stand-in in place.
    import transformers.utils  # noqa: F401

    torch = _Module("torch")
    nn = _Module("torch.nn")
    torch.nn = nn
    sys.modules["torch"] = torch
    sys.modules["torch.nn"] = nn
