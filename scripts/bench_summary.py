"""Ranges of a project's bench ratios over several runs, and whether a rerun
lands inside them.

    python scripts/bench_summary.py RUN.json RUN.json RUN.json [--check RERUN.json ...]

Every `<project> bench` writes a JSON report with `ratios` (name -> float) and
`ratio_details` (name -> {"aa": the A/A control, as a value or as its
per-round spread with a "median", "min"/"median"/"max" of the per-round
ratios, ...}). This prints, per ratio, its value in each run, the
range over the runs and the range of its A/A control: the figures a README
states as "range over N runs". Three runs rarely span where a fourth lands, so
each ratio also gets an expected range for a rerun, the wider of two:

- a 99% prediction interval for one more run, from the runs themselves: on the
  log scale (a ratio's noise is multiplicative), mean +- t(0.995, n-1) * sd *
  sqrt(1 + 1/n). It carries the drift between runs on different days and
  machines, which no within-run control sees, and it is wide when the runs
  are few or disagree, as it should be;
- the observed range widened on both sides by the largest deviation of its
  A/A control from 1 in those runs (a factor: an A/A of 0.8 or 1.25 widens by
  1.25x), since a difference smaller than the A/A's is noise on that machine.
  A ratio without an A/A control is widened by the largest A/A factor of the
  runs, unless it is the same in every run (a count, a deterministic figure),
  which is then expected exactly.

With `--check`, each rerun's ratios are compared with the expected
ranges; the exit status is 1 when any ratio falls outside, 2 on a report that
cannot be read. Ratios present in only some reports are listed with the runs
that have them.

`bench_readme.py` (which uses this module; this one never uses it) renders the
same table into the project's README, between
`<!-- bench-runs:begin -->` and `<!-- bench-runs:end -->` (placed at the end of
its Performance section the first time), from the reports the project keeps in
`benchmarks/`: `run-<n>.json` are the stated runs, `rerun-<n>.json` later runs
checked against them. The README's figures are then reproducible from files in
the project's own folder, and the contract test fails when the block and the
files disagree.
"""

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

# The prediction interval's coverage: with about a hundred ratios over the 13
# projects, 99% leaves about one expected miss per full rerun.
COVERAGE = 0.99


def read_ratios(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(ratio name -> value, ratio name -> its A/A value) of one report."""
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"error: cannot read bench report {path}: {error}") from None
    if not isinstance(report.get("ratios"), dict):
        raise SystemExit(f"error: {path} has no `ratios` object; is it a bench report?")
    ratios = {
        k: float(v)
        for k, v in report["ratios"].items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    details = report.get("ratio_details") or {}
    aa = {}
    for k, d in details.items():
        if not isinstance(d, dict) or k not in ratios:
            continue
        control = d.get("aa")
        # Either the A/A's value, or its per-round spread (then its median).
        if isinstance(control, dict):
            control = control.get("median")
        if isinstance(control, int | float) and not isinstance(control, bool):
            aa[k] = float(control)
    return ratios, aa


def cpu_label(host: dict | None) -> str:
    """One line naming a report's CPU, e.g. `Intel(R) Xeon(R) Processor
    (family 6 model 167; avx2 fma avx512f ...)`; 'CPU not recorded' without one."""
    cpu = (host or {}).get("cpu") or {}
    if not cpu.get("model_name"):
        return "CPU not recorded"
    label = cpu["model_name"]
    if "family" in cpu and "model" in cpu:
        label += f" (family {cpu['family']} model {cpu['model']}"
        flags = " ".join(cpu.get("vector_flags") or []) or "no AVX2"
        label += f"; {flags})"
    return label


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


@dataclasses.dataclass(frozen=True)
class Range:
    """One ratio over the stated runs: its `values` (runs that have it, in
    order), its A/A controls `aas`, and the expected range `low`..`high` for a
    rerun: the wider of the prediction interval (`spread`, its half-width on
    the log scale; 0 with one run or identical values) and the observed range
    widened by `noise` (the A/A's largest deviation from 1 as a factor; 1
    without an A/A)."""

    values: tuple[float, ...]
    aas: tuple[float, ...]
    noise: float

    @property
    def spread(self) -> float:
        n = len(self.values)
        if n < 2 or min(self.values) <= 0:
            return 0.0
        logs = [math.log(v) for v in self.values]
        t = stats.t.ppf(0.5 + COVERAGE / 2, n - 1)
        return float(t * statistics.stdev(logs) * math.sqrt(1 + 1 / n))

    def _centre(self) -> float:
        return statistics.fmean(math.log(v) for v in self.values)

    @property
    def low(self) -> float:
        widened = min(self.values) / self.noise
        if self.spread == 0.0:
            return widened
        return min(widened, math.exp(self._centre() - self.spread))

    @property
    def high(self) -> float:
        widened = max(self.values) * self.noise
        if self.spread == 0.0:
            return widened
        return max(widened, math.exp(self._centre() + self.spread))

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high


def ranges(reports: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, Range]:
    """Ratio name -> its `Range` over `reports` (each as `read_ratios` returns it).

    The noise factor of a ratio is its A/A control's largest deviation from 1,
    either way. A ratio without an A/A control: if it is the same in every run
    it is a deterministic figure (factor 1); if it moves, it gets the largest
    factor of any A/A in these runs, the machine's noise as far as they show it.
    """
    names = sorted({k for ratios, _ in reports for k in ratios})
    values = {n: tuple(r[n] for r, _ in reports if n in r) for n in names}
    aas = {n: tuple(a[n] for _, a in reports if n in a) for n in names}

    def factor(xs: tuple[float, ...]) -> float:
        return max((max(x, 1 / x) for x in xs if x > 0), default=1.0)

    machine = max((factor(a) for a in aas.values()), default=1.0)
    out = {}
    for name in names:
        if aas[name]:
            noise = factor(aas[name])
        elif len(set(values[name])) == 1:
            noise = 1.0
        else:
            noise = machine
        out[name] = Range(values[name], aas[name], noise)
    return out


def summarize(runs: list[Path], checks: list[Path]) -> int:
    """Prints the table; returns the exit status (1 when a rerun is outside)."""
    table = ranges([read_ratios(p) for p in runs])
    rerun = [read_ratios(p) for p in checks]
    outside = 0
    print(f"{len(runs)} runs: " + ", ".join(p.name for p in runs))
    for path in [*runs, *checks]:
        print(f"  {path.name}: {cpu_label(json.loads(path.read_text()).get('host'))}")
    for name, r in table.items():
        line = f"{name}: {fmt(min(r.values))} to {fmt(max(r.values))}"
        line += " (" + ", ".join(fmt(v) for v in r.values) + ")"
        if len(r.values) < len(runs):
            line += f" [in {len(r.values)} of {len(runs)} runs]"
        if r.aas:
            line += f"; A/A {fmt(min(r.aas))} to {fmt(max(r.aas))}"
        if r.low != r.high:
            line += f"; expected in a rerun {fmt(r.low)} to {fmt(r.high)}"
        for path, (ratios, _) in zip(checks, rerun, strict=True):
            if name not in ratios:
                line += f"; {path.name}: absent"
                continue
            inside = r.holds(ratios[name])
            outside += not inside
            line += f"; {path.name}: {fmt(ratios[name])} {'inside' if inside else 'OUTSIDE'}"
        print(line)
    if checks:
        print(f"{outside} ratio(s) outside the expected range")
    return 1 if outside else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench reports of the stated runs")
    parser.add_argument("--check", nargs="*", type=Path, default=[], help="reruns to compare")
    args = parser.parse_args(argv)
    return summarize(args.runs, args.check)


if __name__ == "__main__":
    sys.exit(main())
