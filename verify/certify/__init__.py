"""The certificate for all inputs: composed from the blocks' local certificates for transformers
(``composed``, with ``pointer`` for pointer-following heads), and the product with the task's
automaton for recurrent models (``recurrent``, registered on the same entry point).
"""

from exactformer.verify.certify import recurrent  # noqa: F401  (registers the recurrent certificate)
