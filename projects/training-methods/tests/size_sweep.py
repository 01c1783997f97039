"""Size sweep of stage 1's corruption-split test: how often a CORRECT solution fails it.

    python tests/size_sweep.py [--keys 1024] [--out evidence/size_sweep.json]

Run on demand: pytest does not collect it. `test_corruption_split_matches_its_
probabilities` draws one BERT corruption of 2048 examples (key 3, mask rates
0.15 and 0.4) and compares four shares with their probabilities, each within 5
binomial standard deviations: the selected share of real tokens, and the MASK,
random-symbol and unchanged shares of the selected ones. A correct `corrupt` that
draws otherwise (`mlm-select-by-uniform-below-rate` of reformulations.toml, the
selection as a uniform below the rate) sees other draws, as another key would.
So the test's figures are recomputed here under many keys, for the reference and
both stage-1 rewrites of `corrupt` (`mlm-nested-kind-select` draws the same
numbers and is checked to give the same bits), with the test's own tokens
(`Config.tiny()`, the `corpus` fixture's examples), its own expected shares and
its own limit; the figures at the test's key are checked against those the test
function itself records. Nothing is patched: a rewrite or a seeded bug is applied
to a copy of `mlm.py` loaded as a module of its own.

Written to the JSON's `parts.split`: per rate and formulation, each share's
|z| (its distance from the probability in binomial sds) over keys, the largest
|z| of the four per key, exceedances of the limit, the exact binomial size of
the test (the four shares' tails summed, the three conditional ones averaged
over the selected count), the power (the smallest shift of each share it
detects half the time and 99% of the time), and what the two seeded bugs of
`corrupt` do to the figures. About a minute on a 2-core CPU.

`--part random_symbols` does the same for `test_random_replacements_cover_exactly_
the_symbols` (every real token selected, 3 and 16 symbols): per formulation, the
chi-square statistic of the random symbols' counts over keys (quantiles, failures,
a Kolmogorov-Smirnov test of its p-values against the uniform law the level
assumes), the test's size from its three checks, and the power against one symbol
drawn r times as often as each other one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
import time
import tomllib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conftest  # noqa: E402,F401  (the suite's JAX modes: strict promotion, key reuse)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import test_stage_1_masked as s1  # noqa: E402
from scipy import stats  # noqa: E402

from training_methods import mlm  # noqa: E402
from training_methods.config import Config  # noqa: E402
from training_methods.data import MASK, NUM_SPECIAL, generate, split_ids  # noqa: E402

TEST = s1.test_corruption_split_matches_its_probabilities
SWEEP_SEED = 20_261_209  # keys of the sweep: split(key(SWEEP_SEED + part), count)
RATES = (0.15, 0.4)
REWRITES = ("mlm-select-by-uniform-below-rate", "mlm-nested-kind-select")
BUGS = ("mlm-no-keep-branch", "mlm-selects-padding-and-specials")
LIMIT = 5.0  # binomial sds, the test's `5 * np.sqrt(p * (1 - p) / counts[k])` (checked)
SHARES = ("selected", "mask", "changed_to_random", "unchanged")
TEST_TEXTS = (
    "tokens = jnp.asarray(corpus.tokens[:2048])",
    "c = mlm.corrupt(jax.random.key(3), tokens, rate, config.num_symbols)",
    "abs(observed[k] - p) <= 5 * np.sqrt(p * (1 - p) / counts[k]) for k, p in expected.items()",
    '"changed_to_random": 0.1 * (s - 1) / s,',
    '"unchanged": 0.1 + 0.1 / s,',
    '"mask": float(np.mean(inputs[sel] == 4)),',
    '@pytest.mark.parametrize("rate", [0.15, 0.4])',
)


def check_test_source() -> None:
    source = inspect.getsource(TEST)
    missing = [t for t in TEST_TEXTS if t not in source]
    if missing:
        raise SystemExit(f"The test no longer reads as this sweep assumes; missing: {missing}")
    if MASK != 4:
        raise SystemExit("MASK is no longer token 4, which the test compares with")


def rewritten_mlm(kind: str, entry_id: str) -> types.ModuleType:
    """mlm.py with one entry of reformulations.toml or seeded_bugs.toml applied, as a
    module of its own (nothing patched in place)."""
    table = {"reformulations": "reformulations.toml", "bugs": "seeded_bugs.toml"}[kind]
    with (ROOT / table).open("rb") as f:
        entry = next(r for r in tomllib.load(f)[kind] if r["id"] == entry_id)
    source = Path(mlm.__file__).read_text(encoding="utf-8")
    if source.count(entry["find"]) != 1:
        raise SystemExit(f"`{entry_id}`: its text is not once in {mlm.__file__}")
    module = types.ModuleType(f"training_methods.mlm_{entry_id.replace('-', '_')}")
    module.__file__ = mlm.__file__
    exec(
        compile(source.replace(entry["find"], entry["replace"]), mlm.__file__, "exec"),
        module.__dict__,
    )
    return module


def fixture_inputs() -> tuple[Config, object]:
    """The `config` and `corpus` fixtures of tests/conftest.py, built as they build them."""
    config = Config.tiny()
    splits = split_ids(config)
    return config, generate(config, np.concatenate([splits["train"], splits["heldout"]]))


def split_figures(c, tokens: np.ndarray, s: int, rate: float) -> dict:
    """The test's observed and expected shares, the counts they are shares of, and each
    share's z = (observed - p) / sqrt(p (1 - p) / count)."""
    real = tokens >= NUM_SPECIAL
    sel = np.asarray(c.loss_mask)
    inputs = np.asarray(c.inputs)
    n_real, n_sel = int(real.sum()), int(sel.sum())
    observed = {
        "selected": n_sel / n_real,
        "mask": float(np.mean(inputs[sel] == MASK)),
        "changed_to_random": float(np.mean((inputs[sel] != MASK) & (inputs[sel] != tokens[sel]))),
        "unchanged": float(np.mean(inputs[sel] == tokens[sel])),
    }
    expected = {
        "selected": rate,
        "mask": 0.8,
        "changed_to_random": 0.1 * (s - 1) / s,
        "unchanged": 0.1 + 0.1 / s,
    }
    counts = {"selected": n_real, "mask": n_sel, "changed_to_random": n_sel, "unchanged": n_sel}
    z = {k: (observed[k] - p) / np.sqrt(p * (1 - p) / counts[k]) for k, p in expected.items()}
    passed = all(
        abs(observed[k] - p) <= LIMIT * np.sqrt(p * (1 - p) / counts[k])
        for k, p in expected.items()
    ) and np.array_equal(inputs[~sel], tokens[~sel])
    return {
        "observed": observed,
        "expected": expected,
        "counts": counts,
        "z": z,
        "passed": bool(passed),
    }


def binomial_fail(n: int, p: float, z: float = LIMIT) -> float:
    """Exact P(|K/n - p| > z sqrt(p (1 - p) / n)), K ~ Binomial(n, p)."""
    half = z * np.sqrt(n * p * (1 - p))
    hi, lo = np.floor(n * p + half), np.ceil(n * p - half)
    return float(stats.binom.sf(hi, n, p) + stats.binom.cdf(lo - 1, n, p))


def exact_size(n_real: int, rate: float, s: int) -> dict:
    """The test's size at one rate: the selected share's exact binomial tail, plus each
    selected-share's tail given the selected count m, averaged over m ~ Bin(n_real,
    rate); summed over the four (a Bonferroni bound: the three conditional shares
    are one multinomial draw)."""
    m = np.arange(n_real + 1)
    pmf = stats.binom.pmf(m, n_real, rate)
    live = (pmf > 1e-18) & (m > 0)
    per = {"selected": binomial_fail(n_real, rate)}
    for k, p in (
        ("mask", 0.8),
        ("changed_to_random", 0.1 * (s - 1) / s),
        ("unchanged", 0.1 + 0.1 / s),
    ):
        per[k] = float(sum(pmf[i] * binomial_fail(int(i), p) for i in np.flatnonzero(live)))
    return {
        "per_share": per,
        "sum": float(sum(per.values())),
        "normal_approximation": float(4 * 2 * stats.norm.sf(LIMIT)),
    }


def power(n_real: int, rate: float, s: int) -> dict:
    """Per share, the smallest shift of its probability the test detects half the time
    (5 sds: the limit) and 99% of the time (5 + 2.33 sds), at the expected counts."""
    n_sel = n_real * rate
    out = {}
    for k, p, n in (
        ("selected", rate, n_real),
        ("mask", 0.8, n_sel),
        ("changed_to_random", 0.1 * (s - 1) / s, n_sel),
        ("unchanged", 0.1 + 0.1 / s, n_sel),
    ):
        sd = np.sqrt(p * (1 - p) / n)
        out[k] = {
            "p": p,
            "count": float(n),
            "sd": float(sd),
            "shift_detected_half": float(LIMIT * sd),
            "shift_detected_99": float((LIMIT + stats.norm.isf(0.01)) * sd),
        }
    return out


def sweep(module, tokens_j, tokens, s: int, rate: float, keys) -> list[dict]:
    return [split_figures(module.corrupt(k, tokens_j, rate, s), tokens, s, rate) for k in keys]


def z_record(rows: list[dict]) -> dict:
    worst = [max(abs(r["z"][k]) for k in SHARES) for r in rows]
    v = np.asarray(worst)
    rec = {
        "max_abs_z_of_the_four": {
            "n": int(v.size),
            "median": float(np.median(v)),
            "q99": float(np.quantile(v, 0.99)),
            "max": float(v.max()),
            "limit": LIMIT,
            "exceed": int(np.sum(v > LIMIT)),
        },
        "keys_failed": int(sum(not r["passed"] for r in rows)),
    }
    for k in SHARES:
        z = np.asarray([r["z"][k] for r in rows])
        rec[k] = {
            "z_mean": float(z.mean()),
            "z_sd": float(z.std(ddof=1)),
            "z_min": float(z.min()),
            "z_max": float(z.max()),
            "quantiles_abs_z": {
                q: float(np.quantile(np.abs(z), float(q))) for q in ("0.5", "0.9", "0.99")
            },
        }
    pooled = np.abs(np.asarray([[r["z"][k] for k in SHARES] for r in rows])).ravel()
    rec["pooled_abs_z_over_3"] = {
        "observed": int(np.sum(pooled > 3.0)),
        "normal": float(pooled.size * 2 * stats.norm.sf(3.0)),
    }
    return rec


def part_split(args) -> dict:
    config, corpus = fixture_inputs()
    tokens = np.asarray(corpus.tokens[:2048])
    tokens_j = jnp.asarray(tokens)
    s = config.num_symbols
    n_real = int((tokens >= NUM_SPECIAL).sum())
    out = {
        "examples": int(tokens.shape[0]),
        "real_tokens": n_real,
        "num_symbols": s,
        "keys": args.keys,
        "limit_sds": LIMIT,
    }

    # The test itself at its key, against this sweep's figures.
    check_test_source()
    for rate in RATES:
        log = conftest.Evidence("1")
        TEST(config, corpus, log, rate)
        mine = split_figures(mlm.corrupt(jax.random.key(3), tokens_j, rate, s), tokens, s, rate)
        if log.records[0]["observed"]["observed"] != mine["observed"]:
            raise SystemExit(f"rate {rate}: the sweep's figures differ from the test's")
        out[f"rate {rate}, the test's key 3"] = {"z": mine["z"], "counts": mine["counts"]}

    modules = {"reference": mlm} | {r: rewritten_mlm("reformulations", r) for r in REWRITES}
    bugs = {b: rewritten_mlm("bugs", b) for b in BUGS}
    for i, rate in enumerate(RATES):
        # The same keys for every formulation, made afresh each time (the suite checks
        # key reuse, and a key array is consumed once iterated).
        def keys(count=args.keys, i=i):
            return jax.random.split(jax.random.key(SWEEP_SEED + i), count)

        rec = {"exact_binomial_size": exact_size(n_real, rate, s), "power": power(n_real, rate, s)}
        reference = None
        for label, module in modules.items():
            rows = sweep(module, tokens_j, tokens, s, rate, keys())
            rec[label] = z_record(rows)
            if reference is None:
                reference = rows
            else:
                rec[label]["keys_with_the_reference_figures"] = int(
                    sum(
                        r["observed"] == q["observed"] for r, q in zip(rows, reference, strict=True)
                    )
                )
        for label, module in bugs.items():
            rows = sweep(module, tokens_j, tokens, s, rate, keys(64))
            at_test = split_figures(
                module.corrupt(jax.random.key(3), tokens_j, rate, s), tokens, s, rate
            )
            rec[f"seeded bug {label}"] = {
                "keys": 64,
                "keys_failed": int(sum(not r["passed"] for r in rows)),
                "at_the_tests_key": {"z": at_test["z"], "passed": at_test["passed"]},
                "smallest_max_abs_z_over_keys": float(
                    min(max(abs(r["z"][k]) for k in SHARES) for r in rows)
                ),
            }
        out[f"rate {rate}"] = rec
    return out


SYMBOL_COUNTS = (3, 16)
SYMBOL_TEXTS = (
    "tokens = _random_tokens(s, (200, 30), s, 0.0)",
    "c = mlm.corrupt(jax.random.key(30 + s), jnp.asarray(tokens), 1.0, s)",
    "every_symbol and share_ok and chi2 < CHI2_AT_1E5[s]",
)
CHI2_LEVEL = 1e-5


def symbol_figures(c, tokens: np.ndarray, s: int) -> dict:
    """The random-replacement test's figures: the changed count, its share, the
    chi-square statistic of the symbols' counts, and the verdict of its three checks."""
    inputs = np.asarray(c.inputs)
    values = inputs[(inputs != MASK) & (inputs != tokens)]
    n, p = values.size, 0.1 * (s - 1) / s
    counts = np.bincount(values - NUM_SPECIAL, minlength=s)
    chi2 = float(np.sum((counts - n / s) ** 2 / (n / s)))
    every = set(values.tolist()) == set(range(NUM_SPECIAL, NUM_SPECIAL + s))
    share_ok = abs(n / tokens.size - p) <= LIMIT * np.sqrt(p * (1 - p) / tokens.size)
    return {
        "n": int(n),
        "chi2": chi2,
        "passed": bool(every and share_ok and chi2 < s1.CHI2_AT_1E5[s]),
    }


def symbol_power(n: int, s: int, power_wanted: float) -> float:
    """The ratio r (one symbol drawn r times as often as each other) that the
    chi-square bound detects with probability ``power_wanted`` at ``n`` draws."""
    from scipy.optimize import brentq

    bound = s1.CHI2_AT_1E5[s]

    def power(r: float) -> float:
        q = np.full(s, 1.0 / (s - 1 + r))
        q[0] = r / (s - 1 + r)
        nc = n * float(np.sum((q - 1 / s) ** 2 / (1 / s)))
        return float(stats.ncx2.sf(bound, s - 1, nc)) - power_wanted

    return float(brentq(power, 1.0 + 1e-9, 50.0))


def part_random_symbols(args) -> dict:
    source = inspect.getsource(s1.test_random_replacements_cover_exactly_the_symbols)
    missing = [t for t in SYMBOL_TEXTS if t not in source]
    if missing:
        raise SystemExit(f"The test no longer reads as this sweep assumes; missing: {missing}")
    out: dict = {"keys": args.keys, "level": CHI2_LEVEL}
    modules = {"reference": mlm} | {r: rewritten_mlm("reformulations", r) for r in REWRITES}
    for s in SYMBOL_COUNTS:
        bound = float(stats.chi2.isf(CHI2_LEVEL, s - 1))
        if abs(bound - s1.CHI2_AT_1E5[s]) > 1e-3:
            raise SystemExit(f"CHI2_AT_1E5[{s}] is {s1.CHI2_AT_1E5[s]}, the level gives {bound}")
        tokens = s1._random_tokens(s, (200, 30), s, 0.0)
        tokens_j = jnp.asarray(tokens)
        log = conftest.Evidence("1")
        s1.test_random_replacements_cover_exactly_the_symbols(log, s)
        mine = symbol_figures(mlm.corrupt(jax.random.key(30 + s), tokens_j, 1.0, s), tokens, s)
        if abs(log.records[0]["observed"]["chi2"] - mine["chi2"]) > 1e-9:
            raise SystemExit(f"s={s}: the sweep's chi-square differs from the test's")
        p = 0.1 * (s - 1) / s
        n_expected = round(tokens.size * p)
        share_tail = binomial_fail(tokens.size, p)
        missing_symbol = float(s * (1 - 1 / s) ** n_expected)
        rec: dict = {
            "chi2_bound": s1.CHI2_AT_1E5[s],
            "the_tests_key": mine,
            "size": {
                "chi2": CHI2_LEVEL,
                "share_outside_5_sd": share_tail,
                "a_symbol_never_drawn_at_most": missing_symbol,
                "total_at_most": CHI2_LEVEL + share_tail + missing_symbol,
            },
            "power": {
                "draws": n_expected,
                "ratio_detected_half": symbol_power(n_expected, s, 0.5),
                "ratio_detected_99": symbol_power(n_expected, s, 0.99),
            },
        }
        for label, module in modules.items():
            keys = jax.random.split(jax.random.key(SWEEP_SEED + 100 + s), args.keys)
            rows = [symbol_figures(module.corrupt(k, tokens_j, 1.0, s), tokens, s) for k in keys]
            chi2 = np.asarray([r["chi2"] for r in rows])
            pvalues = stats.chi2.sf(chi2, s - 1)
            rec[label] = {
                "keys_failed": int(sum(not r["passed"] for r in rows)),
                "chi2_quantiles": {
                    q: float(np.quantile(chi2, float(q))) for q in ("0.5", "0.9", "0.99")
                },
                "chi2_max": float(chi2.max()),
                "ks_pvalues_uniform": float(stats.kstest(pvalues, "uniform").pvalue),
                "changed_min_max": [min(r["n"] for r in rows), max(r["n"] for r in rows)],
            }
        out[f"num_symbols {s}"] = rec
    return out


PARTS = {"split": part_split, "random_symbols": part_random_symbols}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=ROOT / "evidence" / "size_sweep.json")
    parser.add_argument("--part", choices=sorted(PARTS), action="append")
    args = parser.parse_args()
    record = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    record.setdefault("parts", {})
    for name in args.part or sorted(PARTS):
        start = time.perf_counter()
        result = PARTS[name](args)
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result["command"] = f"python tests/size_sweep.py --keys {args.keys} --part {name}"
        result["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result["jax"] = jax.__version__
        result["machine"] = f"{platform.machine()}, {jax.default_backend()}"
        record["parts"][name] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {result['wall_s']} s")


if __name__ == "__main__":
    main()
