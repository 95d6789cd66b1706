"""exactformer: a compiler for proven transformer constructions.

The package is split into three subpackages whose imports point down only::

    exactformer.verify        executor, ground truths, certificates, CLI
        -> exactformer.constructions   position codes, model IR, builders
            -> exactformer.precision   exact number formats and integer arithmetic
"""

__version__ = "0.1.0"
