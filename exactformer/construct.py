"""The public surface for writing constructions of one's own (docs/your-construction.md).

Everything a construction needs, importable from this one module in any order::

    from exactformer.construct import (Layout, ModelBuilder, RetrieveByPosition, BitThreshold,
                                       SymbolReadout, SequenceTask, TokenAt, construction, Claim,
                                       NoRows, position_codes)

| group | names |
|---|---|
| the residual stream and the model | :class:`Layout` (named slots), :class:`ModelBuilder` (embeddings, blocks, ``build``: the format chosen from every block's condition and every weight), :class:`CompiledModel`, :class:`Param` |
| position codes | :func:`position_codes` (Lemma 2's near-orthogonal codes) |
| blocks (weights, a sufficient condition, a local certificate) | heads :class:`RetrieveByPosition`, :class:`SetAverage`, :class:`UniformAverage`; MLPs :class:`BitThreshold`, :class:`XorMLP`, :class:`PatternMLP`, :class:`SignClip`, :class:`MatchIndicator`; readouts :class:`SymbolReadout`, :class:`ThresholdReadout`, :class:`AverageReadout` |
| blocks of one's own | :func:`block` (register the class, so saved models load), :class:`MLPBlock`, :class:`ReadoutBlock` (certified from their weights), :class:`HeadBlock` |
| tasks and specifications | :class:`SequenceTask` with the rules :class:`TokenAt`, :class:`TokenAtPointer`, :class:`FunctionOf`, :class:`CountOver` (tables from the truth); for other inputs :class:`Task`, :class:`Domains`, :class:`Batch` and the specifications :class:`Reads`, :class:`Select`, :class:`CountOf`, :class:`CountThreshold` |
| registration | :func:`construction` with :class:`Claim` and :class:`SizeRows` / :class:`NoRows` |
| formats | :class:`FixedPoint`, :class:`Format`, :func:`parse_format` |

Building, running, verifying and saving are the API's (``import exactformer as xf``: ``xf.build``,
``xf.verify``, ``xf.save``, ``xf.load``). Every other module of ``exactformer.constructions`` is
internal: its names may change without notice; these may not.
"""

from __future__ import annotations

from exactformer.constructions.blocks import (AverageReadout, BitThreshold, HeadBlock, MatchIndicator, MLPBlock, PatternMLP,
                                              ReadoutBlock, RetrieveByPosition, SetAverage, SignClip, SymbolReadout,
                                              ThresholdReadout, UniformAverage, XorMLP, block)
from exactformer.constructions.codes.positions import position_codes
from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.core.registry import Claim, NoRows, SizeRows, construction
from exactformer.constructions.core.sequence import CountOver, FunctionOf, SequenceTask, TokenAt, TokenAtPointer
from exactformer.constructions.core.spec import CountOf, CountThreshold, Reads, Select
from exactformer.constructions.core.task import Batch, Domains, Task
from exactformer.precision import FixedPoint, Format, parse_format

__all__ = [
    "Layout", "ModelBuilder", "CompiledModel", "Param", "position_codes",
    "RetrieveByPosition", "SetAverage", "UniformAverage", "BitThreshold", "XorMLP", "PatternMLP", "SignClip",
    "MatchIndicator", "SymbolReadout", "ThresholdReadout", "AverageReadout",
    "block", "HeadBlock", "MLPBlock", "ReadoutBlock",
    "SequenceTask", "TokenAt", "TokenAtPointer", "FunctionOf", "CountOver",
    "Task", "Domains", "Batch", "Reads", "Select", "CountOf", "CountThreshold",
    "construction", "Claim", "SizeRows", "NoRows",
    "FixedPoint", "Format", "parse_format",
]
