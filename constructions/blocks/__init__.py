"""Building blocks: weights on named slots, a sufficient condition, a local certificate each.

| block | where | what it proves (local certificate) |
|---|---|---|
| :class:`RetrieveByPosition` | head | logits = P * <code(q), code(k)> + c from the codes' generators; per query the unique target, its rounded weight and the stray weights per level; the output box over the target's view |
| :class:`RetrieveByAddress` | head | the same, with the query code read from the views (an earlier layer wrote it) |
| :class:`RetrieveNearest`, :class:`RetrieveByMatch` | head | under the task's margin precondition: weight >= a on the nearest (matching) candidate; a content pointer variable |
| :class:`UniformAverage` | head | constant logits; the output as a function of the number of positions whose weighted value is in the upper of two boxes |
| :class:`SetAverage` | head | W_Q = 0 and keys reading one 0/1 member column of the positional table: the members tie at the top logit; their weight from the softmax with a tied level; the output as a function of the number of members in the upper of two boxes, plus the others' weighted values |
| :class:`MatchHead` | head | +-1 codes, one default (BOS) key and eta from the weights; every row with c matches has the EMA weights round(S/c) (BOS weight 1 at c = 0); the output as a function of the match count c |
| :class:`BitThreshold`, :class:`XorMLP`, :class:`PatternMLP`, :class:`MatchIndicator`, :class:`SignClip` | MLP | the exact image of the units over the view's boxes (units sharing a pre-activation are tracked as one) |
| :class:`SymbolReadout`, :class:`ThresholdReadout`, :class:`AverageReadout` | unembedding | the logits' boxes per view assignment; the answer where one logit's lower bound beats every other's upper bound |
| :class:`FollowPointer`, :class:`LatestMatch` | head (pointer certificate) | the position code a query holds is followed to its key (or sigma: the latest earlier match, else the default key); the output copies the value there, a pointer further |
| :class:`CleanCode` | MLP | in place: clip to +-1 (exact once |raw| >= 1), the scratch column back to 0 |
| :class:`WordSum` | MLP | words (a presence column and p bits): their sum mod 2^p where the gates are on, by robust steps (no local certificate: checked by the MPC simulation invariant) |
| :class:`CodeReadout` | unembedding | the token whose code the slot holds |

:data:`BLOCKS` is the table of every block by class name, filled by the decorator :func:`block`
that each block class carries (a saved plan names its blocks; importing this package registers all of
the above, so loading a built-in model needs no other import). A block of one's own is a frozen
dataclass deriving from :class:`HeadBlock`, :class:`MLPBlock` or :class:`ReadoutBlock` with
``@block`` above it (docs/your-construction.md).
"""

from typing import Any

from exactformer.constructions.blocks.average import SetAverage, UniformAverage
from exactformer.constructions.blocks.base import (BLOCKS, Block, BlockError, HeadBlock, MLPBlock, PointerHead,
                                                   ReadoutBlock, ViewHead, block)
from exactformer.constructions.blocks.content import RetrieveByAddress, RetrieveByMatch, RetrieveNearest, SignClip
from exactformer.constructions.blocks.match import MatchHead, MatchIndicator
from exactformer.constructions.blocks.mlp import BitThreshold, PatternMLP, XorMLP, mlp_image
from exactformer.constructions.blocks.pointer import CleanCode, CodeReadout, FollowPointer, LatestMatch
from exactformer.constructions.blocks.readout import AverageReadout, SymbolReadout, ThresholdReadout
from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.blocks.words import WordSum
from exactformer.constructions.core.proof import CertContext, Unproven


def block_from_json(d: dict[str, Any]) -> Block:
    """The block that :meth:`Block.to_json` wrote into ``d``."""
    name = d.get("block")
    if name not in BLOCKS:
        raise ValueError(f"unknown block {name!r} (known: {', '.join(sorted(BLOCKS))}; a block of one's own "
                         "registers with @block when its module is imported)")
    return BLOCKS[name].from_fields(d)


__all__ = ["BLOCKS", "Block", "BlockError", "block", "HeadBlock", "ViewHead", "PointerHead", "MLPBlock", "ReadoutBlock",
           "CertContext", "Unproven", "block_from_json", "FollowPointer", "LatestMatch", "CleanCode", "CodeReadout",
           "RetrieveByPosition", "RetrieveByAddress", "RetrieveNearest", "RetrieveByMatch", "UniformAverage",
           "SetAverage", "MatchHead", "BitThreshold", "XorMLP", "PatternMLP", "MatchIndicator", "SignClip", "mlp_image",
           "SymbolReadout", "ThresholdReadout", "AverageReadout", "WordSum"]
