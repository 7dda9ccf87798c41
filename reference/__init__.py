"""Exact pure-PyTorch reference of HiLS sliding-window attention (SPEC.md).

The single source of truth of the project's semantics:

- :func:`sliding_window_attention`: the canonical interface, computed exactly.
- :func:`golden` / :func:`same_dtype`: the two precisions the conformance
  tolerance is built from (float64 ground truth; what a kernel computes from
  inputs in their dtype: fp32 scores and sums, 16-bit probabilities into ``P @ V``).
- :mod:`reference.mask`: the visibility rule, the only copy in the project.
- :func:`check_inputs`: the one validation every backend runs first.
"""

from .attention import golden, same_dtype, sliding_window_attention
from .errors import UnsupportedConfig
from .mask import (
    is_landmark,
    key_positions,
    query_positions,
    render_mask,
    seen_keys,
    visibility_mask,
    visible,
    visible_counts,
    visible_key_range,
    window_left,
)
from .validation import CANONICAL_DTYPES, Problem, check_inputs

__all__ = [
    "sliding_window_attention", "golden", "same_dtype", "UnsupportedConfig",
    "check_inputs", "Problem", "CANONICAL_DTYPES",
    "visible", "visibility_mask", "visible_counts", "visible_key_range", "seen_keys", "window_left",
    "is_landmark",
    "query_positions", "key_positions", "render_mask",
]
