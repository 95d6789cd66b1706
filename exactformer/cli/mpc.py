"""``exactformer mpc``: P2's MPC equivalences executed (docs/mpc.md, "Thm 4.2" and "Thm 4.4").

``--kind anna`` compiles a planted ANNA-transformer (Alg. 1) into an MPC protocol (Thm 4.2), runs it on
the MPC runtime and checks it against Alg. 1 layer by layer; ``--kind ema`` does the same for a
library protocol's EMA program (the round trip protocol → EMA program → protocol); ``--kind low-rank``
runs Thm 4.4's pipeline (a low-rank transformer, its MPC simulation, the ANNA-transformer Thm 4.1
compiles from it); ``--kind resources`` writes the Thm 4.2 resource table (and figure).

Registered by exactformer/cli/main.py (imported when the command is resolved). A bad option prints one
line ``error: <parameter>: <what is allowed>`` and exits 2; a failed check exits 1.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from exactformer.cli.output import fail, print_json, print_table
from exactformer.precision import FixedPoint, parse_format

KINDS = ("anna", "ema", "low-rank", "resources")


class _Bad(Exception):
    """A bad option: (parameter, what is allowed)."""


def _int(text: Optional[str], name: str, lo: int, hi: int, default: int) -> int:
    if text is None:
        return default
    from exactformer.arguments import ArgumentError, parse_int

    try:
        v = parse_int(text, name, f"an integer in [{lo}, {hi}]")
    except ArgumentError as e:
        raise _Bad(str(e)) from None
    if not lo <= v <= hi:
        raise _Bad(f"{name}: must be an integer in [{lo}, {hi}], got {v}")
    return v


def _float(text: Optional[str], name: str, lo: float, hi: float, default: float | None) -> float | None:
    if text is None:
        return default
    try:
        v = float(text)
    except ValueError:
        raise _Bad(f"{name}: must be a number in ({lo}, {hi}), got {text!r}") from None
    if not lo < v < hi:
        raise _Bad(f"{name}: must be a number in ({lo}, {hi}), got {text!r}")
    return v


def _only(kind: str, allowed: tuple[str, ...], **given: Any) -> None:
    for name, value in given.items():
        if value not in (None, [], False) and kind not in allowed:
            raise _Bad(f"--{name.replace('_', '-')}: only with --kind {' or '.join(allowed)}")


def _format(text: Optional[str]) -> FixedPoint | None:
    if text is None:
        return None
    try:
        fmt = parse_format(text)
    except ValueError as e:
        raise _Bad(f"--precision: {e}") from None
    if not isinstance(fmt, FixedPoint) or not fmt.int64_mode:
        raise _Bad(f"--precision: must be a fixed-point format (binary:int=I,frac=F), got {text!r}")
    return fmt


def _progress(total: int | None, unit: str, quiet: bool):
    """A bar on stderr, on a terminal only."""
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, leave=False)


def _batched(sources, batch: int):
    for kind, x in sources:
        for lo in range(0, len(x), batch):
            yield kind, x[lo:lo + batch]


def _thm42(sim, sources, count: int | None, quiet: bool, c: float | None) -> dict[str, Any]:
    from exactformer.verify.mpc.anna_check import BATCH_WORDS, MAX_WORDS, check
    from exactformer.verify.mpc.anna_mpc import work_words

    work = work_words(sim)
    if work > MAX_WORDS:
        raise _Bad(f"--n: the simulation's largest round needs about {work:.3g} words for one input (limit "
                   f"{MAX_WORDS:.3g}); use a smaller --n or fewer --tables (a larger --approx-c), or --kind resources "
                   "(built, not run)")
    bar = _progress(count, "inputs", quiet)

    def counted(src):
        for kind, x in src:
            yield kind, x
            if bar is not None:
                bar.update(len(x))

    r = check(sim, counted(_batched(sources, max(1, BATCH_WORDS // max(work, 1)))))
    if bar is not None:
        bar.close()
    pl, N = sim.plan, sim.plan.n
    gap = pl.eps_prime - pl.eps
    tables = max(lp.pairs for lp in pl.layers) if pl.layers else 0
    out = {"n": N, "eps": round(pl.eps, 4), "eps_prime": round(pl.eps_prime, 4), "width": pl.width,
           "memory": pl.memory, "memory_over_n_eps_prime": round(pl.memory / N ** pl.eps_prime, 3),
           "machines": pl.machines, "token_machines": pl.token_machines, "tokens_per_machine": pl.tok_per,
           "machines_over_n_squared": pl.machines / N ** 2, "rounds": pl.rounds,
           "round_bound": round(r.round_bound, 2), "rounds_times_gap_over_layers": round(pl.rounds * gap / max(1, sim.T.layers), 3),
           "sort_levels": [lp.sort.levels for lp in pl.layers], "tables_per_layer": tables, "word_bits": pl.word_bits}
    if c is not None:
        th = N ** (1 + pl.eps - pl.eps_prime + 3 / (c * c))
        out |= {"approx_c": c, "machines_theorem": round(th), "machines_over_theorem": round(pl.machines / th, 3)}
    return out | {"inputs": r.inputs, "sources": r.sources, "peak": r.peak, "seconds": round(r.seconds, 3),
                  "passed": r.passed, "reason": r.reason}


def _anna(N, eps_prime, eps, layers, heads, tables, hashes, approx_c, lsh_family, value_words, alphabet, fmt, samples,
          seed, quiet) -> dict[str, Any]:
    from exactformer.verify.attention.anna import FAMILIES
    from exactformer.verify.mpc.anna_check import default_sources
    from exactformer.verify.mpc.anna_mpc import ANNAMPCError, compile_anna, width_exponent
    from exactformer.verify.mpc.anna_program import ANNAProgramError, planted_transformer
    from exactformer.verify.mpc.anna_resources import table_tables

    fam = lsh_family or "bit-sampling"
    if fam not in FAMILIES:
        raise _Bad(f"--family: must be one of {' | '.join(FAMILIES)}, got {fam!r}")
    ell = tables if tables is not None else table_tables(N, approx_c)
    try:
        T = planted_transformer(N, layers=layers, heads=heads, dim=16 if fam == "bit-sampling" else 8,
                                value_words=value_words, alphabet=alphabet, tables=ell, hashes=hashes, family=fam,
                                seed=seed)
        e = eps if eps is not None else width_exponent(T)
        sim = compile_anna(T, eps_prime if eps_prime is not None else e + 0.25, eps, fmt=fmt)
    except (ANNAMPCError, ANNAProgramError) as err:
        raise _Bad(str(err)) from None
    head = {"kind": "anna", "transformer": dict(T.program.params), "precision": None if fmt is None else fmt.name}
    return head | _thm42(sim, default_sources(sim, samples, seed, alphabet), samples + 4, quiet,
                         approx_c if tables is None else None)


def _ema(N, eps_prime, eps, application, params, fmt, samples, seed, quiet) -> dict[str, Any]:
    from exactformer.constructions.mpc.applications import APPLICATIONS, ApplicationError
    from exactformer.verify.mpc import check as mpc_check
    from exactformer.verify.mpc.anna_mpc import ANNAMPCError, compile_anna, width_exponent
    from exactformer.verify.mpc.anna_program import from_program

    if application not in APPLICATIONS:
        raise _Bad(f"--application: must be one of {' | '.join(APPLICATIONS)}, got {application!r}")
    kw = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _Bad(f"--param: must be NAME=INTEGER, got {item!r}")
        kw[key.strip()] = _int(value, f"--param {key.strip()}", 1, 1 << 20, 0)
    try:
        m = mpc_check.build(application, N, **kw)
        T = from_program(m.program)
        e = eps if eps is not None else width_exponent(T)
        sim = compile_anna(T, eps_prime if eps_prime is not None else e + 0.25, eps, fmt=fmt or m.fmt)
    except (ApplicationError, ANNAMPCError) as err:
        raise _Bad(f"--param: {err}" if isinstance(err, ApplicationError) else str(err)) from None

    def sources():
        for b in m.application.adversarial(m.compiled, 1 << 20, seed + 1):
            yield b.kind, b.arrays[0]
        for b in m.application.sample(m.compiled, samples, seed):
            yield b.kind, b.arrays[0]

    head = {"kind": "ema", "application": application, "params": dict(m.params),
            "protocol_rounds": len(m.protocol.rounds), "precision": (fmt or m.fmt).name}
    return head | _thm42(sim, sources(), None, quiet, None)


def _low_rank(N, eps_prime, eps, layers, heads, rank, value_words, alphabet, fmt, samples, seed) -> dict[str, Any]:
    from exactformer.constructions.mpc.low_rank import LowRankError, random_low_rank, width_exponent
    from exactformer.verify.mpc.low_rank import check, simulate

    try:
        T = random_low_rank(N, layers=layers, heads=heads, rank=rank, value_words=value_words, alphabet=alphabet,
                            seed=seed)
        e = eps if eps is not None else width_exponent(T)
        sim = simulate(T, eps_prime if eps_prime is not None else e + 0.25, eps, fmt)
    except LowRankError as err:
        raise _Bad(str(err)) from None
    r = check(sim, samples=samples, seed=seed)
    return {"kind": "low-rank", "transformer": dict(T.program.params), "precision": r.fmt} | r.sizes | {
        "inputs": r.inputs, "levels": r.levels, "approximation": r.approximation, "seconds": round(r.seconds, 3),
        "passed": r.passed, "reason": r.reason}


def _resources(max_log_n, run_words, doc, figure, quiet) -> dict[str, Any]:
    from exactformer.verify.mpc import anna_resources as ar

    log_ns = [e for e in ar.LOG_NS if e <= max_log_n]
    if not log_ns:
        raise _Bad(f"--max-log-n: must be >= {ar.LOG_NS[0]}, got {max_log_n}")
    bar = _progress(len(ar.CONFIGS) * len(log_ns), "rows", quiet)
    rs = ar.rows(ar.CONFIGS, log_ns, run_words=run_words, progress=None if bar is None else lambda r: bar.update(1))
    if bar is not None:
        bar.close()
    text = ar.markdown(rs)
    out: dict[str, Any] = {"kind": "resources", "rows": [r.to_json() for r in rs], "markdown": text,
                           "exponents": [{"eps": k[0], "eps_prime": k[1], "c": k[2]} | v
                                         for k, v in ar.exponents(rs).items()],
                           "passed": all(r.agrees in (None, True) for r in rs)}
    if figure is not None:
        out["figure"] = str(ar.figure(rs, figure))
    if doc is not None:
        path = Path(doc)
        if not path.is_file():
            raise _Bad(f"--doc: no such file {doc!r}")
        try:
            path.write_text(ar.replace_table_block(path.read_text(), "anna-resources", text))
        except ar.ResourceError as e:
            raise _Bad(str(e)) from None
        out["doc"] = doc
    return out


def mpc(
    kind: str = typer.Option("anna", "--kind", metavar="KIND",
                             help="anna (Thm 4.2 on a planted ANNA-transformer) | ema (Thm 4.2 on a library protocol's "
                                  "EMA program: the round trip) | low-rank (Thm 4.4) | resources (the Thm 4.2 table)"),
    n: Optional[str] = typer.Option(None, "--n", metavar="N", help="tokens N (anna, ema, low-rank; default 256)"),
    eps_prime: Optional[str] = typer.Option(None, "--eps-prime", metavar="EPS'",
                                            help="ε′ > ε: local memory s = O(N^ε′) (default ε + 0.25)"),
    eps: Optional[str] = typer.Option(None, "--eps", metavar="EPS",
                                      help="ε: the transformer's width is W = O(N^ε) (default log_N W)"),
    layers: Optional[str] = typer.Option(None, "--layers", metavar="L", help="anna, low-rank: layers (default 2)"),
    heads: Optional[str] = typer.Option(None, "--heads", metavar="H", help="anna, low-rank: heads per layer (default 1)"),
    tables: Optional[str] = typer.Option(None, "--tables", metavar="ELL",
                                         help="anna: hash tables ℓ per head (default ⌈N^{3/c²}⌉)"),
    hashes: Optional[str] = typer.Option(None, "--hashes", metavar="Z", help="anna: hash functions per table z (default 8)"),
    approx_c: Optional[str] = typer.Option(None, "--approx-c", metavar="C",
                                           help="anna: approximation factor c, for the default ℓ and the machine bound "
                                                "N^{1+ε−ε′+3/c²} (default 3)"),
    lsh_family: Optional[str] = typer.Option(None, "--family", metavar="FAMILY",
                                             help="anna: bit-sampling | hyperplane | cross-polytope (default bit-sampling)"),
    value_words: Optional[str] = typer.Option(None, "--value-words", metavar="DV",
                                              help="anna, low-rank: value words per head (default 1 / 2)"),
    alphabet: Optional[str] = typer.Option(None, "--alphabet", metavar="A",
                                           help="anna, low-rank: inputs are words in [0, A) (default 4 / 8)"),
    rank: Optional[str] = typer.Option(None, "--rank", metavar="R", help="low-rank: rank r (default 2)"),
    application: Optional[str] = typer.Option(None, "--application", metavar="NAME",
                                              help="ema: match2 | induction-heads | k-hop | prefix-sums | sort "
                                                   "(default k-hop)"),
    param: Optional[list[str]] = typer.Option(None, "--param", metavar="NAME=VALUE",
                                              help="ema: a protocol parameter, repeatable (k-hop: hops, alphabet, "
                                                   "branching; match2: modulus; prefix-sums: word_bits, fan_in; sort: "
                                                   "value_bits)"),
    precision: Optional[str] = typer.Option(None, "--precision", metavar="FORMAT",
                                            help="anna, ema, low-rank: head outputs in fixed point binary:int=I,frac=F "
                                                 "(default: exact; ema: the program's coarsest exact format)"),
    samples: Optional[str] = typer.Option(None, "--samples", metavar="COUNT",
                                          help="seeded random inputs besides the named ones (default 100)"),
    seed: Optional[str] = typer.Option(None, "--seed", metavar="SEED",
                                       help="seed of the transformer, the hash functions and the inputs (default 0)"),
    max_log_n: Optional[str] = typer.Option(None, "--max-log-n", metavar="E",
                                            help="resources: rows N = 2^8 .. 2^E (default 16)"),
    run_words: Optional[str] = typer.Option(None, "--run-words", metavar="WORDS",
                                            help="resources: rows whose largest layout holds at most WORDS words are "
                                                 "also run on the MPC runtime (default 8000000)"),
    doc: Optional[str] = typer.Option(None, "--doc", metavar="FILE",
                                      help="resources: rewrite the anna-resources table block of FILE (docs/mpc.md)"),
    figure: Optional[str] = typer.Option(None, "--figure", metavar="FILE", help="resources: draw the figure into FILE"),
    json: bool = typer.Option(False, "--json", help="print one JSON object on stdout (schema: docs/cli.md)"),
) -> None:
    """P2's MPC equivalences executed: Thm 4.2 (MPC simulates ANNA), Thm 4.4 (ANNA simulates low-rank attention)."""
    try:
        out = _mpc(kind, n, eps_prime, eps, layers, heads, tables, hashes, approx_c, lsh_family, value_words, alphabet,
                   rank, application, param or [], precision, samples, seed, max_log_n, run_words, doc, figure, json)
    except _Bad as e:
        fail(str(e), json)
    if json:
        print_json(out)
    elif out["kind"] == "resources":
        print(out["markdown"])
    else:
        rows = [[k, v] for k, v in out.items()]
        print_table(f"mpc --kind {out['kind']}", ["quantity", "value"], rows, header=False)
    if not out["passed"]:
        raise typer.Exit(1)


def _mpc(kind, n, eps_prime, eps, layers, heads, tables, hashes, approx_c, lsh_family, value_words, alphabet, rank,
         application, params, precision, samples, seed, max_log_n, run_words, doc, figure, quiet) -> dict[str, Any]:
    if kind not in KINDS:
        raise _Bad(f"--kind: must be one of {' | '.join(KINDS)}, got {kind!r}")
    _only(kind, ("anna", "ema", "low-rank"), n=n, eps_prime=eps_prime, eps=eps, precision=precision, samples=samples)
    _only(kind, ("anna", "low-rank"), layers=layers, heads=heads, value_words=value_words, alphabet=alphabet)
    _only(kind, ("anna",), tables=tables, hashes=hashes, approx_c=approx_c, family=lsh_family)
    _only(kind, ("low-rank",), rank=rank)
    _only(kind, ("ema",), application=application, param=params)
    _only(kind, ("resources",), max_log_n=max_log_n, run_words=run_words, doc=doc, figure=figure)
    s = _int(seed, "--seed", 0, 2**32 - 1, 0)
    if kind == "resources":
        return _resources(_int(max_log_n, "--max-log-n", 4, 20, 16), _int(run_words, "--run-words", 0, 1 << 40,
                                                                        8_000_000), doc, figure, quiet)
    N = _int(n, "--n", 2, 1 << 20, 256)
    ep = _float(eps_prime, "--eps-prime", 0.0, 5.0, None)
    e = _float(eps, "--eps", 0.0, 5.0, None)
    fmt = _format(precision)
    count = _int(samples, "--samples", 0, 1 << 20, 100)
    if kind == "ema":
        return _ema(N, ep, e, application or "k-hop", params, fmt, count, s, quiet)
    L = _int(layers, "--layers", 1, 64, 2)
    H = _int(heads, "--heads", 1, 64, 1)
    if kind == "low-rank":
        return _low_rank(N, ep, e, L, H, _int(rank, "--rank", 1, 64, 2), _int(value_words, "--value-words", 1, 64, 2),
                         _int(alphabet, "--alphabet", 2, 1 << 16, 8), fmt, count, s)
    c = _float(approx_c, "--approx-c", 1.0, math.inf, 3.0)
    return _anna(N, ep, e, L, H, _int(tables, "--tables", 1, 1 << 16, 0) if tables is not None else None,
                 _int(hashes, "--hashes", 1, 62, 8), c, lsh_family, _int(value_words, "--value-words", 1, 1 << 12, 1),
                 _int(alphabet, "--alphabet", 2, 1 << 16, 4), fmt, count, s, quiet)
