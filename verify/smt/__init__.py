"""The smt mode: a second prover, independent of the certificates, for any model at small N.

The model is encoded as it runs -- its fixed-point forward pass with every rounding and saturation
(docs/precision.md), the rounded exp as a table, the readout's strict argmax and answer labels, at
its answer positions -- beside the task's truth, and z3 is asked for an input where they differ
(docs/smt.md). It shares nothing with :mod:`exactformer.verify.certify`, the blocks' certificates
or the views: only the model, the format and the task.

z3 (``z3-solver``) is an optional dependency: ``pip install -e '.[smt]'``.
"""
