"""Exception types shared by every backend."""


class UnsupportedConfig(NotImplementedError):
    """A valid input (per SPEC.md) that this backend cannot serve.

    The message names the backend and what is unsupported, for example
    ``"triton: head dim Dqk=512 is not supported (32..256)"``. It is raised
    before any kernel runs. The conformance suite reports it as
    ``unsupported`` with this message; it is never a silent fallback.
    """
