"""EMA-program constructions in the registry: ``xf.build``, ``model(inputs)``, ``xf.verify`` and the
CLI handle induction heads and k-hop like every other construction (the verifier dispatches on the
model's kind; the four-way check stands in for the missing certificate)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from exactformer.constructions.core import registry
from exactformer.constructions.mpc.protocol import ProtocolError
from exactformer.constructions.mpc.applications import ProgramModel, count_rgs
from exactformer.cli.main import app
from exactformer.verify.mpc.check import MPCModel
from exactformer.verify.verifier import VerifyError
from typer.testing import CliRunner

import exactformer as xf
from exactformer.api import BuildError

W = [0, 0, 1, 2, 1, 0, 1, 2, 0]  # aabcbabca (P2 L123)


def test_registered_and_built_through_the_api():
    assert {"induction-heads", "k-hop", "match2"} <= set(xf.constructions())
    h = xf.build("k-hop", n=9, k=2, alphabet=3)
    assert isinstance(h, MPCModel) and isinstance(h.compiled, ProgramModel) and h.params["hops"] == 2
    assert h(W) == [None, 0, None, None, None, None, 1, 2, 0]  # 2-hop at position 9: a (P2 L129)
    assert h([W, W]) == [h(W)] * 2 and h(W, fmt="default") == h(W) == h.truth(W) == h.mpc(W)
    assert xf.k_hop(9, 2, 3)(W) == h(W)  # the builder as an attribute, positional arguments
    ih = xf.build("induction-heads", n=9, alphabet=3)
    assert ih(W)[8] == 1  # σ(w, 9) = 7, w_7 = b


def test_bad_parameters_name_what_the_user_typed():
    with pytest.raises(ProtocolError, match="k must be an integer >= 1"):
        xf.build("k-hop", n=9, k=0)
    with pytest.raises(BuildError, match="hops"):
        xf.build("k-hop", n=9, hops=2)  # the protocol's name is not the builder's
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 3\)"):
        xf.build("k-hop", n=9, k=2, alphabet=3)([0, 0, 1, 2, 1, 0, 1, 2, 3])


def test_verify_dispatches_on_the_model_kind():
    h = xf.build("k-hop", n=8, k=3, alphabet=8)
    r = xf.verify(h, mode="exhaustive")  # every equality pattern: Bell(8) strings
    assert r.passed and r.inputs_covered == count_rgs(8) == 4140 and r.construction == "k-hop"
    assert r.details["levels"] == ["mpc", "ideal", h.fmt.name, "truth"] and r.layers == h.resources.layers
    c = xf.verify(h)  # no mode: the strongest the program declares (no certificate; Bell(8) inputs fit)
    assert c.passed and c.mode == "exhaustive" and c.mode_reason.startswith("no certificate for k-hop")
    with pytest.raises(VerifyError, match="mode: no certificate for k-hop; its modes: exhaustive | sample"):
        xf.verify(h, mode="certify")  # a mode it does not have: a bad argument, not a failed verification
    a, b = xf.verify(h, mode="sample", samples=30, seed=4), xf.verify(h, mode="sample", samples=30, seed=4)
    assert a.passed and a.seed == 4 and a.inputs_covered == b.inputs_covered and "seed 4" in a.reason
    with pytest.raises(VerifyError, match=r"too many inputs to count, above the limit of 2\^22"):
        xf.verify(xf.build("k-hop", n=4096), mode="exhaustive")  # count_rgs: more than 2^1000
    with pytest.raises(VerifyError, match="device"):
        xf.verify(h, mode="sample", device="cuda")


def test_a_broken_program_is_a_counterexample_in_the_report():
    h = xf.build("induction-heads", n=8)
    prog, last = h.program, h.program.layers[-1]

    def post(state, outs):  # the last layer forgets its answers
        new = last.post(state, outs)
        return new | {"answer": np.zeros_like(new["answer"])}

    broken = dataclasses.replace(h.compiled, program=dataclasses.replace(
        prog, layers=prog.layers[:-1] + (dataclasses.replace(last, post=post),)))
    r = xf.verify(broken, mode="exhaustive")
    assert not r.passed and r.counterexample["kind"] == "invariant" and r.counterexample["level"] == "ideal"
    assert r.counterexample["field"] == "answer" and r.inputs_covered == 1


runner = CliRunner()


def test_the_command_line():
    r = runner.invoke(app, ["verify", "k-hop", "--n", "9", "--k", "2", "--alphabet", "3", "--mode", "exhaustive",
                            "--json"])
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["passed"] and d["inputs_covered"] == count_rgs(9, 3) and d["mode"] == "exhaustive"
    r = runner.invoke(app, ["verify", "induction-heads", "--n", "64", "--json"])  # no mode: the strongest it has
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["passed"] and d["mode"] == "sample" and d["mode_reason"].startswith("no certificate")
    r = runner.invoke(app, ["verify", "induction-heads", "--n", "8", "--mode", "certify", "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"].startswith("--mode: no certificate for induction-heads")
    r = runner.invoke(app, ["verify", "induction-heads", "--n", "16", "--mode", "sample", "--samples", "5", "--json"])
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["passed"] and d["seed"] == 0 and d["details"]["sources"]["sample"] == 5
    r = runner.invoke(app, ["build", "k-hop", "--n", "8", "--out", "unused"])
    assert r.exit_code == 2 and "EMA program" in r.output
    r = runner.invoke(app, ["verify", "k-hop", "--n", "8", "--k", "0"])
    assert r.exit_code == 2 and "k must be an integer >= 1" in r.output
    assert "--k" in runner.invoke(app, ["verify", "k-hop", "--help"]).stdout


def test_every_program_construction_in_the_registry_verifies():
    for name in ("induction-heads", "k-hop"):
        m = registry.get(name).builder(n=7)
        r = xf.verify(m, mode="sample", samples=20)
        assert r.passed and r.construction == name, r.reason
