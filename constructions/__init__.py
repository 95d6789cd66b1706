"""exactformer.constructions: what is built.

| folder | what |
|---|---|
| ``core/`` | the model IR (``ir``), residual slots and assembly (``builder``), tasks (``task``), specifications (``spec``), the registry (``registry``), views of the residual stream (``views``, ``views_ops``) |
| ``codes/`` | position codes (``positions``: Lemma 2, Reed-Solomon o Hadamard, random, one-hot), their generators, Gram certificates and inner products |
| ``blocks/`` | reusable blocks: weights on named slots, a sufficient condition and a local certificate each |
| ``design/`` | the searches builders share: eta and the format with the fewest bits, the two-layer family's readout |
| ``theorems/`` | one module per theorem of both papers; each registers its constructions |
| ``mpc/`` | P2's MPC protocols, their library, the compiler to EMA programs, the applications' tasks |
| ``export/`` | files (safetensors + manifest), plain torch and TransformerLens |

The package is also the API's verb ``xf.constructions()``: every registered construction, name ->
theorem (the design card names the subpackage ``exactformer.constructions``, so it is callable).
"""

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self) -> dict[str, str]:
        """``xf.constructions()``: every registered construction, name -> theorem."""
        from exactformer.constructions.core import registry

        return {name: registry.get(name).theorem for name in registry.names()}


sys.modules[__name__].__class__ = _CallableModule
