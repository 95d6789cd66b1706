"""Building blocks: weights on named slots, a sufficient condition, a local certificate each.

| block | where | what it proves (local certificate) |
|---|---|---|
| :class:`RetrieveByPosition` | head | logits = P * <code(q), code(k)> + c from the codes' generators; per query the unique target, its rounded weight and the stray weights per level; the output box over the target's view |
| :class:`UniformAverage` | head | constant logits; the output as a function of the number of positions whose weighted value is in the upper of two boxes |
| :class:`MatchHead` | head | +-1 codes, one default (BOS) key and eta from the weights; every row with c matches has the EMA weights round(S/c) (BOS weight 1 at c = 0); the output as a function of the match count c |
| :class:`BitThreshold`, :class:`XorMLP`, :class:`PatternMLP`, :class:`MatchIndicator` | MLP | the exact image of the units over the view's boxes (units sharing a pre-activation are tracked as one) |
| :class:`SymbolReadout`, :class:`ThresholdReadout` | unembedding | the logits' boxes per view assignment; the answer where one logit's lower bound beats every other's upper bound |
"""

from exactformer.constructions.blocks.average import UniformAverage
from exactformer.constructions.blocks.base import BLOCKS, Block, CertContext, Unproven
from exactformer.constructions.blocks.match import MatchHead, MatchIndicator
from exactformer.constructions.blocks.mlp import BitThreshold, PatternMLP, XorMLP, mlp_image
from exactformer.constructions.blocks.readout import SymbolReadout, ThresholdReadout
from exactformer.constructions.blocks.retrieve import RetrieveByPosition

__all__ = ["BLOCKS", "Block", "CertContext", "Unproven", "RetrieveByPosition", "UniformAverage", "BitThreshold",
           "XorMLP", "PatternMLP", "mlp_image", "SymbolReadout", "ThresholdReadout", "MatchHead", "MatchIndicator"]
