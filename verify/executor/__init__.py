"""Running a model: the exact executor (``exact``: transformers; ``recurrent``: recurrent models,
registered on the same entry point), the plain reference forward pass with every activation
(``forward``), the exported torch module in float32/float64 (``torch_run``).
"""

from exactformer.verify.executor import recurrent  # noqa: F401  (registers the recurrent executor)
