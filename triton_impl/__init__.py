"""Triton backend of HiLS sliding-window attention, forward (SPEC.md).

Layers: :mod:`triton_impl.api` (public adapter: validation, outputs, path
choice), :mod:`triton_impl.launch` (config table, launchers, split-KV scratch),
:mod:`triton_impl.kernels` (the ``@triton.jit`` kernels).

On CPU tensors the kernels run only under the Triton interpreter; set
``TRITON_INTERPRET=1`` before importing this package. Under the interpreter,
bf16 tiles are upcast to fp32 right after loading (the interpreter computes
bf16 wrongly, triton-lang/triton#11584), so CPU bf16 results are those of
fp32 arithmetic on bf16 inputs; the probabilities fed to ``P @ V`` and the outputs are
rounded to bf16 (to nearest, ties to even: ``kernels._bf16_rne``) before the
interpreter's conversion, which truncates.
"""

from reference.errors import UnsupportedConfig

from .api import describe_call, sliding_window_attention

__all__ = ["sliding_window_attention", "describe_call", "UnsupportedConfig"]
