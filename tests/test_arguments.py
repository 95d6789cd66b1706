"""The Python API checks what the command line checks (one check per parameter, used by both), and
input counts are written short everywhere (no thousand-digit numbers, no int-to-str crash)."""

from __future__ import annotations

import io
import json
import re
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import exactformer as xf
from exactformer.constructions.core.task import _power, count_log2, format_count
from exactformer.cli.main import app
from exactformer.verify.mpc import check as mpc_check
from exactformer.verify.verifier import VerifyError
from registered import NoCertificateTask, register_tiny

ROOT = Path(__file__).resolve().parents[1]
FEATURES = ROOT / "docs" / "examples" / "feats.json"


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def cli_error(*args: str) -> str:
    """The one error line of a bad input (exit 2, also as JSON under --json)."""
    r = cli(*args, "--json")
    assert r.exit_code == 2, (r.exit_code, r.output)
    message = json.loads(r.stdout)["error"]
    assert r.stderr.strip() == f"error: {message}" and "Traceback" not in r.output
    return message


@pytest.fixture(scope="module")
def il():
    return xf.build("index-lookup", n=16, alphabet=4)


# ---- verification arguments ------------------------------------------------------------------------------------------


def test_device_cuda_without_a_cuda_device(il, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(VerifyError, match="^device: cuda: no CUDA device is available") as e:
        xf.verify(il, device="cuda")  # certify mode passed silently before
    assert e.value.parameter == "device"
    assert cli_error("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--device", "cuda") == \
        f"--device: {e.value.reason}"


def test_unknown_device(il):
    with pytest.raises(VerifyError, match=r"^device: must be one of cpu \| cuda, got 'bogus'"):
        xf.verify(il, device="bogus")
    assert cli_error("verify", "index-lookup", "--n", "16", "--device", "bogus") == \
        "--device: must be one of cpu | cuda, got 'bogus'"


def test_samples_and_seed_only_in_sample_mode(il):
    for kw in ({"samples": 5}, {"seed": 3}):
        with pytest.raises(VerifyError, match=f"^{next(iter(kw))}: only with mode sample"):
            xf.verify(il, mode="certify", **kw)
        with pytest.raises(VerifyError, match="only with mode sample .this run's mode is certify"):
            xf.verify(il, **kw)  # no mode: the strongest is certify, where samples mean nothing
    assert cli_error("verify", "index-lookup", "--n", "16", "--mode", "certify", "--samples", "5").startswith(
        "--samples: only with mode sample")
    assert xf.verify(il, mode="sample", samples=5, seed=3).inputs_covered == 10


def test_negative_seed_names_the_seed(il):
    with pytest.raises(VerifyError, match=r"^seed: must be an integer >= 0, got -3"):
        xf.verify(il, mode="sample", seed=-3)  # numpy's "expected non-negative integer" before
    assert cli_error("verify", "index-lookup", "--n", "16", "--mode", "sample", "--seed", "-3") == \
        "--seed: must be an integer >= 0, got -3"
    with pytest.raises(VerifyError, match="^samples: must be an integer >= 1"):
        xf.verify(il, mode="sample", samples=2.5)


@pytest.fixture
def uncertified():
    """A registered construction whose task declares no certificate."""
    yield from register_tiny("tiny-uncertified-lookup", NoCertificateTask())


def test_save_refuses_what_is_not_a_weight_model(tmp_path):
    with pytest.raises(VerifyError, match=r"^model: must be a built construction \(xf.build / xf.load\), got str"):
        xf.save("notamodel", tmp_path / "a")  # AttributeError before
    with pytest.raises(VerifyError, match="^model: must be a built construction .* got ProgramModel"):
        xf.save(mpc_check.build("k-hop", 8, hops=2), tmp_path / "b")  # an MPC program: the check's reference level
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("name,kw", [("equality", dict(n=8)), ("dyck-rnn", dict(n=8))])
def test_save_onto_a_file_is_one_line_naming_out_dir(tmp_path, name, kw):
    """xf.save onto an existing file raised a bare FileExistsError; a directory under a file, a bare
    NotADirectoryError. An earlier export's directory is written again (its files replaced)."""
    m = xf.build(name, **kw)
    taken = tmp_path / "taken"
    taken.write_text("not a model")
    with pytest.raises(ValueError, match=r"^out_dir: '.*taken' is an existing file, not a directory; give a directory"):
        xf.save(m, taken, certify=False)
    with pytest.raises(ValueError, match=r"^out_dir: cannot create '.*taken/sub': Not a directory$"):
        xf.save(m, taken / "sub", certify=False)
    assert taken.read_text() == "not a model"
    for _ in range(2):
        xf.save(m, tmp_path / "again", certify=False)
    assert xf.load(tmp_path / "again").compiled.fingerprint() == m.compiled.fingerprint()


def test_a_mode_the_construction_lacks_is_bad_input(uncertified):
    h = xf.build(uncertified, n=64)
    with pytest.raises(VerifyError, match=rf"^mode: no certificate for {uncertified}; its modes: exhaustive \| sample"):
        xf.verify(h, mode="certify")
    assert cli_error("verify", uncertified, "--n", "64", "--mode", "certify") == \
        f"--mode: no certificate for {uncertified}; its modes: exhaustive | sample"


def test_defaults_pass_in_the_strongest_mode(uncertified, monkeypatch):
    """`exactformer verify induction-heads --n 64` printed FAIL: certify was the default for a
    construction without a certificate. Induction heads have one now (their weights); a construction
    without one is proved by smt where z3 is installed and it is small enough, else sampled, and
    says why."""
    r = cli("verify", "induction-heads", "--n", "64")
    assert r.exit_code == 0 and "PASS" in r.stdout and "mode chosen" in r.stdout
    d = xf.verify(xf.build(uncertified, n=64)).to_dict()
    assert d["passed"] and d["mode"] == "smt" and d["inputs_covered"] == "all" and d["samples"] is None
    assert d["mode_reason"].startswith(f"no certificate for {uncertified}; 2^64*64 inputs, above the exhaustive limit "
                                       "of 2^22; smt: a proof for every input by an SMT solver (z3); its size estimate")
    monkeypatch.setattr("exactformer.verify.smt.available", lambda: False)  # z3 not installed: sampled, as before
    d = xf.verify(xf.build(uncertified, n=64)).to_dict()
    assert d["passed"] and d["mode"] == "sample" and d["samples"] == 1000 and d["seed"] == 0
    assert d["mode_reason"] == (f"no certificate for {uncertified}; 2^64*64 inputs, above the exhaustive limit of 2^22; "
                                "sample: seeded random and adversarial inputs")
    m = xf.build("equality", n=8)
    assert m.verify().mode == "certify" and m.verify().mode_reason == "certify: the strongest mode, a proof for every input"
    assert m.verify(mode="certify").mode_reason is None  # asked for: nothing to explain


# ---- build arguments: one conversion for xf.build and the command line ------------------------------------------------


def test_features_may_be_a_json_file_from_python_too(monkeypatch):
    monkeypatch.chdir(ROOT)
    features = json.loads(FEATURES.read_text())
    by_list = xf.build("threshold", n=16, features=features, b=2)
    for given in ("docs/examples/feats.json", FEATURES, FEATURES.read_text()):  # a list of characters before
        m = xf.build("threshold", n=16, features=given, b=2)
        assert m.params["features"].value == by_list.params["features"].value
        assert np.array_equal(m.task_params["feature_index"], by_list.task_params["feature_index"])
        assert m.task_params["types"] == by_list.task_params["types"]
    with pytest.raises(ValueError, match="^features: no such file 'nofile.json'") as e:
        xf.build("threshold", n=16, features="nofile.json")
    assert cli_error("verify", "threshold", "--n", "16", "--features", "nofile.json") == f"--{e.value}"


@pytest.mark.parametrize("content,holds", [('"hello"', 'a JSON string ("hello")'), ("3", "a JSON number (3)"),
                                           ('{"count": 2}', 'a JSON object ({"count": 2})'), ("null", "JSON null (null)")])
def test_a_features_file_holding_no_list_says_what_it_holds(tmp_path, content, holds):
    """A features file holding a JSON string was read as a file name ("no such file 'hello'")."""
    path = tmp_path / "f.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"^features: {re.escape(str(path))} holds {re.escape(holds)}, not a list") as e:
        xf.build("threshold", n=16, features=str(path), b=2)
    assert cli_error("verify", "threshold", "--n", "16", "--features", str(path)) == f"--{e.value}"


def test_clauses_and_terms_as_the_command_line_writes_them():
    assert xf.build("dnf", n=16, terms="1,-2;3,4").params["features"].value == \
        xf.build("dnf", n=16, terms=[[1, -2], [3, 4]]).params["features"].value
    with pytest.raises(ValueError, match=r"^clauses must look like '1,-2;3,4'") as e:
        xf.build("cnf", n=16, clauses="1,2;;3")  # read as a JSON file's name before
    assert cli_error("verify", "cnf", "--n", "16", "--clauses", "1,2;;3") == f"--clauses: {e.value}"


def test_a_given_eta_that_does_not_fit_names_eta():
    with pytest.raises(ValueError, match=r"^eta = 20 does not fit precision binary:int=4,frac=2"):
        xf.build("match2", n=8, eta=20, precision="binary:int=4,frac=2")  # a bare IRError before
    message = cli_error("verify", "match2", "--n", "8", "--eta", "20", "--precision", "binary:int=4,frac=2")
    assert message.startswith("match2: eta = 20 does not fit precision binary:int=4,frac=2")


def test_an_unknown_precision_is_named_without_an_unrelated_suffix():
    with pytest.raises(ValueError, match="^precision: unknown format 'float16'") as e:
        xf.build("index-lookup", n=16, precision="float16")
    assert "paper:kc=K" not in str(e.value)
    message = cli_error("verify", "index-lookup", "--n", "16", "--precision", "float16")
    assert message == f"--{e.value}" and "paper:kc=K" not in message
    assert "paper:kc=K is paper:n=N,kc=K" in cli_error("verify", "index-lookup", "--n", "16", "--precision", "paper:x")
    assert xf.build("index-lookup", n=16, alphabet=4, precision="paper:kc=2").precision == "paper:n=16,kc=2"


# ---- input counts ---------------------------------------------------------------------------------------------------------


def test_format_count():
    assert format_count(4140) == "4140" and format_count(1 << 22) == "2^22" and format_count(2**4096, 4096) == "2^4096"
    assert format_count(64**4096 * 4096, 4096) == "64^4096*4096" and format_count(37**32, 32) == "37^32"
    assert format_count(4**16 * 16, 16) == "4^16*16" and format_count(3**40 * 7) == "3^40*7"
    assert format_count(10480142147) == "10480142147"  # Bell(16): no product of powers, written out below 10^12
    assert format_count(math.factorial(200)) == f"about 2^{math.log2(math.factorial(200)):.1f}"
    assert format_count(math.inf) == "too many to count" and count_log2(math.inf) is None
    assert count_log2(64**4096 * 4096) == 24588.0


def test_power_splits_by_squares_as_by_single_factors():
    """_power finds base^e by the squares that divide the count; equal to dividing one factor at a
    time, including the edges (e = 0, rest 1, e one below and at a power of 2)."""
    def one_at_a_time(c, b):
        e = 0
        while c % b == 0:
            c, e = c // b, e + 1
        return e, c
    rng = np.random.default_rng(0)
    for b in (2, 3, 5, 7, 6, 64):
        for e in (0, 1, 2, 3, 7, 8, 15, 16, 17, 100, 1023, 1024):
            for rest in (1, 11, int(rng.integers(1, 10**9)) * b + 1):
                assert _power(b**e * rest, b) == one_at_a_time(b**e * rest, b), (b, e, rest)


@pytest.mark.parametrize("args,count", [
    (["index-lookup", "--n", "4096", "--alphabet", "64"], "64^4096*4096"),  # int-to-str ValueError, exit 1 before
    (["equality", "--n", "16384"], "2^16384"),
])
def test_exhaustive_refusals_write_counts_short(args, count):
    message = cli_error("verify", *args, "--mode", "exhaustive")
    assert message.startswith("--mode: exhaustive: ") and f"has {count} inputs, above the limit of 2^22" in message
    assert len(message) < 200


def test_exhaustive_refusal_from_the_api():
    m = xf.build("index-lookup", n=2400, alphabet=64)  # 64^2400 * 2400: 4339 digits
    with pytest.raises(VerifyError, match=r"^mode: exhaustive: index-lookup at N = 2400 has 64\^2400\*2400 inputs"):
        xf.verify(m, mode="exhaustive")


def test_verify_all_exhaustive_refusal_is_one_short_line():
    message = cli_error("verify", "all", "--n", "4096", "--mode", "exhaustive")  # 1,371 characters before
    assert message == ("--mode: exhaustive: index-lookup at N = 4096 has 64^4096*4096 inputs, above the limit of "
                       "2^22; use certify | sample")


def test_reports_carry_the_count_short(il):
    d = xf.verify(il).to_dict()
    assert d["input_count"] == "4^16*16" and d["input_count_log2"] == 36.0 and d["inputs_covered"] == "all"
    d = xf.verify(xf.build("nearest-neighbor", n=8), mode="sample", samples=2).to_dict()
    assert d["input_count"] == "too many to count" and d["input_count_log2"] is None
    assert max(len(str(v)) for v in d.values() if isinstance(v, (int, str))) < 200


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("mode,seen", [("exhaustive", "/4096 "), ("sample", "/100 "), ("certify", "certify equality n=12")])
def test_long_runs_from_python_show_progress(monkeypatch, mode, seen):
    """xf.verify and m.verify from Python showed nothing however long the run; on a terminal they now
    show a bar (inputs with total and ETA, or the certificate's step) once a run lasts
    PROGRESS_DELAY seconds; progress=False, or stderr in a log, shows nothing."""
    from exactformer.verify import verifier

    monkeypatch.setattr(verifier, "PROGRESS_DELAY", 0)
    m = xf.build("equality", n=12)
    kw = dict(samples=50) if mode == "sample" else {}
    for call in (lambda **k: xf.verify(m, mode=mode, **k), lambda **k: m.verify(mode, **k)):
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert call(**kw).passed
        assert seen in terminal.getvalue() and f"{mode} equality n=12" in terminal.getvalue()
        quiet = _Terminal()
        monkeypatch.setattr(sys, "stderr", quiet)
        assert call(progress=False, phase=False, **kw).passed and quiet.getvalue() == ""
        log = io.StringIO()  # not a terminal
        monkeypatch.setattr(sys, "stderr", log)
        assert call(**kw).passed and log.getvalue() == ""
    calls = []
    assert xf.verify(m, mode="exhaustive", progress=calls.append).passed and sum(calls) == 4096  # a callback given is used
