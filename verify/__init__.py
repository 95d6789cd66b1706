"""exactformer.verify: the executor, certificates, the verifier and the CLI.

The package is also the public function ``xf.verify(model, mode=None, ...)`` (a callable
module; no mode: the strongest the construction has), so that ``exactformer.verify`` names both the subpackage of the design card and the API
function (see :func:`exactformer.verify.verifier.verify`).
"""

import sys
import types

from exactformer.verify.verifier import Report, verify as _verify


class _CallableModule(types.ModuleType):
    def __call__(self, model, mode: str | None = None, **kwargs) -> Report:
        """Verify a built model (``xf.build`` / ``xf.load``): see :func:`exactformer.verify.verifier.verify`."""
        return _verify(model, mode=mode, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
