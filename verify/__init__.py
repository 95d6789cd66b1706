"""exactformer.verify: whether a built model is right.

| folder | what |
|---|---|
| ``executor/`` | the exact executor (``exact``), the plain reference forward pass with every activation (``forward``), the exported torch module's runs (``torch_run``) |
| ``certify/`` | the certificate for all inputs, composed from the blocks' local certificates (``composed``) |
| ``attention/`` | P2's attention kernels: exact-match attention (``ema``) and ANNA (``anna``) |
| ``mpc/`` | P2's MPC protocols and EMA programs run and checked level by level (``protocol_run``, ``program_run``, ``check``) |
| ``bounds/`` | the papers' lower bounds (``lower_bounds``), built sizes beside them and their figures (``sizes``) |
| ``verifier.py`` | modes (certify, exhaustive, sample), their arguments and the report |
| ``precision_scan.py`` | the smallest precision that certifies |

The package is also the API's verb ``xf.verify(model, mode=None, ...)``
(:func:`exactformer.verify.verifier.verify`): the design card names the subpackage
``exactformer.verify``, so the package is callable. Nothing is imported here until it is called.
"""

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, model: Any, mode: str | None = None, **kwargs: Any) -> Any:
        """``xf.verify``: :func:`exactformer.verify.verifier.verify`, with a progress bar on a
        terminal for a long run unless ``progress`` / ``phase`` are given (False: none)."""
        from exactformer.verify.verifier import shown_progress, verify

        with shown_progress(model, mode, kwargs) as kw:
            return verify(model, mode=mode, **kw)


sys.modules[__name__].__class__ = _CallableModule
