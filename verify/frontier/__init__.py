"""The precision frontier: for each construction and arithmetic the largest N (a power of two) at
which a build is certified, and for fixed point the fewest bits per N.

``grid`` (the jobs, the chains of N per construction and arithmetic, the arguments), ``jobs``
(one build and certificate, run on a worker), ``cache`` (results by construction, parameters,
arithmetic, N and code version, on disk), ``run`` (:func:`frontier`: the grid on the engine of
:mod:`exactformer.verify.distributed`), ``report`` (JSON, CSV and Markdown tables), ``figures``
(bits against log2 N beside the paper's precision, the heat map). docs/precision-frontier.md says
what the results mean.
"""

from exactformer.verify.frontier.run import Frontier, frontier

__all__ = ["Frontier", "frontier"]
