"""Equality and Inequality with two layers of width O(log N) (Theorem 6, App. F.2 of Bhattamishra
et al. 2024).

Tasks, for x in {-1, 1}^N with N even: EQ(x) = 1 iff (x_1 .. x_{N/2}) = (x_{N/2+1} .. x_N), and
INEQ(x) = 1 - EQ(x) = OR_{i <= N/2} [x_i != x_{i+N/2}].

Construction (the paper's equations reconstructed in docs/equality.md). T(1..N) is a position code;
position i (0-based) has the partner t(i) = i in the first half and i - N/2 in the second::

    slots:  x | y | m | z | kcode (k) | qcode (k)
    token x_i at i:  x = x_i;  positional: kcode = T(i), qcode = T(t(i))
    layer 0: RetrieveByPosition(query=qcode, key=kcode, value=x -> y), scale eta, offset -1/2
             (logit eta <T(t(i)), T(j)> - eta/2: the paper's [T, 1] . [T, -1/2])
             XorMLP(x, y -> m): m_i = [x_i != x_{t(i)}] (0 on the first half)
    layer 1: UniformAverage(m -> z): z = a * #{i : x_i != x_{i+N/2}}
    readout: ThresholdReadout(z): INEQ iff c z > c a / 2, i.e. iff some pair differs

Guarantee: correct whenever every first-layer row is within the XOR MLP's tolerance of one-hot
((1 - target) + rest <= 1/2) and the uniform weight a is positive; by default eta makes every
worst-case row exactly one-hot. ``equality(n)`` answers EQ, ``inequality(n)`` answers INEQ (the
same weights, readout columns swapped).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks.average import UniformAverage
from exactformer.constructions.blocks.mlp import XorMLP
from exactformer.constructions.blocks.readout import ThresholdReadout
from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.theorems.boolean_tasks import EqualityTask
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.task import TaskError
from exactformer.constructions.design.two_layer import (arithmetics_param, code_for, etas_by_mode, kc_equivalent, paper_eta,
                                                        readout, resolve)
from exactformer.constructions.design.precision_search import design_arithmetics
from exactformer.precision import Format

THEOREM = "Thm 6 (App. F.2), Bhattamishra et al. 2024"
CLAIM = Claim("P1 Thm 6 (Sec. 5.1, App. F.2)", "2", "2 (TF^2_{m,p,2}; built: one per layer with a residual)", "O(log N)",
              "O(log N)", "O((log N)^3) total (Sec. 5, App. A (2))")
MAX_N = 1 << 30  # built and certified in O(polylog N): position codes are generators, never tables
KEY_OFFSET = Fraction(-1, 2)  # the paper's key entry -1/2 (a per-row constant: softmax ignores it)


class EqualityError(TaskError):
    """Bad parameters for :func:`equality` / :func:`inequality`."""


def _build(n: int, positions: Any, eta: Any, precision: Any, max_inner: Fraction, seed: int, ineq: bool,
           arithmetics: Any) -> CompiledModel:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= MAX_N or n % 2:
        raise EqualityError(f"n must be an even integer in [2, 2^30], got {n!r}")
    n, h = int(n), int(n) // 2
    code, mu = code_for(n, positions, max_inner, seed, EqualityError)
    k, gram = int(code.k), Fraction(code.gram_scale)
    asked = design_arithmetics(arithmetics, EqualityError)

    def smaller(n2: int) -> tuple[int, Fraction, Fraction, int]:  # the design's inputs at a smaller N
        c2, mu2 = code_for(n2, positions if isinstance(positions, str) else "auto", max_inner, seed, EqualityError)
        return n2, Fraction(c2.gram_scale), mu2, 0

    fmt, eta, notes = resolve(n, n, gram, mu, eta, precision, XorMLP.TOLERANCE, KEY_OFFSET, 0, EqualityError, asked,
                              smaller)
    a, c, l0 = readout(fmt, n, 0, notes["robust"])

    L = Layout()
    for name, width in (("x", 1), ("y", 1), ("m", 1), ("z", 1), ("kcode", k), ("qcode", k)):
        L.add(name, width)
    mb = ModelBuilder(L, n_layers=2, d_vocab=2, n_ctx=n)
    mb.token_rows([0, 1], "x", np.array([[-1], [1]]))
    mb.position_code("kcode", 0, n, code)  # position i: T(i)
    mb.position_code("qcode", 0, h, code)  # first half: its own code
    mb.position_code("qcode", h, h, code)  # second half: the partner's code T(i - N/2)
    RetrieveByPosition("qcode", "kcode", ("x",), ("y",), eta, gram, KEY_OFFSET).emit(mb, 0)
    XorMLP("x", "y", "m").emit(mb, 0)
    UniformAverage("m", "z").emit(mb, 1)
    ThresholdReadout("z", Fraction(c), l0, yes=1 if ineq else 0).emit(mb)
    kc = kc_equivalent(fmt, n)
    eta_modes = etas_by_mode(fmt, eta, notes, gram, mu, n, XorMLP.TOLERANCE, KEY_OFFSET)
    name = "inequality" if ineq else "equality"
    model = mb.build(answers=[0, 1], vocab=["-1", "+1"], construction=name, theorem=THEOREM, n=n,
                     precision=fmt.name, task_params={"n": n, "answer": "INEQ" if ineq else "EQ",
                                                      "code": code.describe() if hasattr(code, "describe") else {}})
    bits = int(getattr(fmt, "bits", 64))
    model.params = {
        "k": Param(k, f"position code dimension ({getattr(code, 'family', type(code).__name__)})"),
        "mu": Param(mu, "proved (or certified) largest off-diagonal <T(i), T(j)>"),
        "eta": Param(eta, notes["eta"]),
        "eta_one_hot": Param(eta_modes["one-hot"],
                             "smallest grid eta with every worst-case row exactly one-hot: e(-eta(1-mu)) = 0"),
        "eta_threshold": Param(eta_modes["threshold"],
                               "smallest grid eta with (1 - target) + rest <= 1/2 in the worst-case row"),
        "Kc": Param(None if kc is None else round(kc, 6), "App. B.2 constant of the format: step = N^-Kc"),
        "eta_paper": Param(None if kc is None else round(paper_eta(n, kc), 6), "ln N + Kc ln(2N) (App. F.2)"),
        "uniform_weight": Param(a, "a = div(e(0), sat(N e(0))) under the format (= 1/N when unsaturated and on the grid)"),
        "readout_gain": Param(c, "c = largest power of two <= min(1/a, max)"),
        "readout": Param(f"logit_INEQ = {c} z, logit_EQ = {l0}", "c*z vs l0 (between 0 and c*min(a, 1/N)): INEQ iff some pair differs"),
        "d_model": Param(4 + 2 * k, "4 + 2k (paper: 2 + 2k; y and z get their own columns)"),
        "d_head": Param(k + 1, "k + 1 (layer 1: code plus the constant of [T, 1] / [T, -1/2])"),
        "d_mlp": Param(4, "4 ReLUs for the XOR step in layer 1"),
        "layers": Param(2, "Thm 6"),
        "heads": Param(1, "one head per layer"),
        "precision": Param(fmt.name, notes["precision"]),
        "precision_bits": Param(bits, "bits of one number in the format (sign included)"),
        "arithmetics": arithmetics_param(fmt, notes),
        "size_bits": Param(model.size_bits(bits), "parameters (code rows generated, not stored) x precision_bits"),
        "paper_k": Param(getattr(code, "paper_k", None), "ceil(8 ln(2N) / mu^2) (Lemma 2)"),
    }
    model.position_code = code
    return model


@construction("equality", task=EqualityTask(complement=False), theorem=THEOREM, claim=CLAIM,
              sizes=SizeRows("equality", build_max_n=MAX_N, max_n=MAX_N, built_to=MAX_N))
def equality(n: int, positions: str = "auto", eta: Fraction | str | None = None, precision: Format | str | None = None,
             max_inner: Fraction = Fraction(1, 4), seed: int = 0,
             arithmetics: str | tuple[str, ...] | None = None) -> CompiledModel:
    """Theorem 6's two-layer Equality transformer: EQ(x) for x in {-1, 1}^N.

    Parameters
    ----------
    n : even int in [2, 2^30]. Input length N (two halves of N/2).
    positions : auto | reed-solomon | random | onehot (Python: also a PositionCode with at least N vectors).
    eta : robust | threshold | minimal | a number > 0. The first layer's scale. robust (default): the
        smallest that makes every worst-case row exactly one-hot in the format and within the XOR
        MLP's tolerance in exact reals, float64 and float32; threshold: within the tolerance
        everywhere; minimal: one-hot in the format only (fixed-point only); or given.
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32. Default: the fewest-bit binary format
        that satisfies the sufficient condition.
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3 (Python: also a tuple). The float arithmetics the robust design checks besides
        the format. Default: real, float64, float32, dropping float32, then float64, where no format
        up to 48 bits allows them; given: exactly these, refused with the largest N at which a format
        allows them (or, for a given eta, the smallest eta that works).
    """
    return _build(n, positions, eta, precision, max_inner, seed, False, arithmetics)


@construction("inequality", task=EqualityTask(complement=True), theorem=THEOREM, claim=CLAIM,
              sizes=SizeRows("equality", build_max_n=MAX_N, max_n=MAX_N, built_to=MAX_N))
def inequality(n: int, positions: str = "auto", eta: Fraction | str | None = None, precision: Format | str | None = None,
               max_inner: Fraction = Fraction(1, 4), seed: int = 0,
               arithmetics: str | tuple[str, ...] | None = None) -> CompiledModel:
    """Theorem 6's two-layer Inequality transformer: INEQ(x) = 1 - EQ(x) (the paper's formulation).

    Parameters
    ----------
    n : even int in [2, 2^30]. Input length N (two halves of N/2).
    positions : auto | reed-solomon | random | onehot (Python: also a PositionCode with at least N vectors).
    eta : robust | threshold | minimal | a number > 0 (see equality).
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32 (see equality).
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3; see equality (Python: also a tuple).
    """
    return _build(n, positions, eta, precision, max_inner, seed, True, arithmetics)
