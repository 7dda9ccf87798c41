"""TileLang backend of HiLS sliding-window attention (forward).

``sliding_window_attention`` follows SPEC.md; see :mod:`tilelang_impl.api`
(adapter), :mod:`tilelang_impl.launch` (configs, cache, path choice),
:mod:`tilelang_impl.kernels` (TileLang kernels) and :mod:`tilelang_impl.macros`
(the rule and the online softmax, written once).
"""

from reference.errors import UnsupportedConfig

from .api import describe_call, sliding_window_attention

__all__ = ["sliding_window_attention", "describe_call", "UnsupportedConfig"]
