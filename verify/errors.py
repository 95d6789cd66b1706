"""The error of a bad argument to the verifier, the frontier and the engine that shards them: one
class below all of them (the verifier imports the distributed engine, which raises it too).
"""

from __future__ import annotations


class VerifyError(ValueError):
    """A bad argument to :func:`verify` (a mode the construction does not have, a sample count, an
    exhaustive run over the limit ...): ``parameter`` is its name, ``reason`` what it allows;
    ``str(e)`` is ``"<parameter>: <reason>"``."""

    def __init__(self, parameter: str, reason: str):
        super().__init__(f"{parameter}: {reason}")
        self.parameter, self.reason = parameter, reason
