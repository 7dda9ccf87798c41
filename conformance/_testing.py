"""Backends for the suite's own tests (not mutants: they break the process, not a rule)."""

import time

import reference


def hangs_on_63(q, k, v, **kw):
    """The reference, except that it hangs (sleeps 120 s) on every case with Lq == 63."""
    if q.dim() == 4 and q.shape[2] == 63:
        time.sleep(120)
    return reference.sliding_window_attention(q, k, v, **kw)
