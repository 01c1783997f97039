"""A frozen question and a paired comparison, read back from the tracking store.

A comparison spec (YAML) fixes, before any run: the question, the baseline
config, the ONE mechanism that changes (a config field and its candidate
value), the training seeds and evaluation seeds, the metric, and the decision
rule. Its sha256 (over the validated spec, so formatting does not count)
names it:

  1. `register` creates a parent run tagged `comparison.spec_sha256` with the
     spec as an artifact. A spec name already registered with another hash is
     refused: the question is frozen once asked.
  2. `run_comparison` runs every (train seed, eval seed) pair, baseline then
     candidate, as child runs carrying the same hash. A failing arm is kept
     (FAILED, with its error); the other runs go on.
  3. `analyze` reads the spec and every child back from the store only,
     computes candidate - baseline per pair, a percentile bootstrap interval
     of the mean over complete pairs, and applies the decision rule. A pair
     with a missing or unfinished arm is reported as incomplete: never dropped
     silently, never imputed; with `require_complete` (the default) any
     incomplete pair makes the verdict `undecided`.
"""

import hashlib
import itertools
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import numpy as np
import pydantic
import yaml
from mlflow import MlflowClient
from mlflow.entities import RunTag
from mlflow.exceptions import MlflowException
from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from reproducible_experiments import data, plots, record
from reproducible_experiments.config import Config
from reproducible_experiments.tracking import TrackedRun, TrackingError, iter_runs

METRICS = ("test_accuracy", "test_loss")
# A seed as `Config` takes it (`train_seed`, `eval_seed`): checked when the spec is read,
# not when the first child run is built.
Seed = Annotated[int, Field(ge=0, lt=2**31)]
SEED_FIELDS = ("train_seed", "eval_seed")
ARMS = ("baseline", "candidate")


class SpecError(ValueError):
    """A comparison spec that cannot be used; the message says why."""


class FrozenSpecError(SpecError):
    """A spec whose name is already registered with a different content."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Mechanism(_Strict):
    field: str
    """The one config field the candidate changes."""
    value: float | int
    """Its value in the candidate arm."""


class MetricDefinition(_Strict):
    name: Literal["test_accuracy", "test_loss"] = "test_accuracy"
    """The final metric each run logs that the question is about."""
    higher_is_better: StrictBool = True
    """Direction of improvement."""


class DecisionRule(_Strict):
    min_difference: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """The candidate wins when the whole bootstrap interval of the mean paired
    difference lies beyond this margin, on the side of improvement."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Coverage of the percentile bootstrap interval."""
    resamples: int = Field(default=10_000, ge=100, le=1_000_000)
    """Bootstrap resamples."""
    bootstrap_seed: int = Field(default=0, ge=0)
    """Seed of the bootstrap's NumPy generator (the analysis is deterministic)."""
    require_complete: StrictBool = True
    """Any incomplete pair makes the verdict `undecided`."""


class Spec(_Strict):
    """A frozen comparison. See `specs/dropout.yaml`."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=80)
    """Kebab-case name; one name, one content, forever."""
    question: str = Field(min_length=10)
    """The question, in words, as asked before any run."""
    baseline: dict[str, Any]
    """Config fields of the baseline (the rest take `Config` defaults); no seeds."""
    mechanism: Mechanism
    train_seeds: list[Seed] = Field(min_length=1)
    """Training seeds; every one is crossed with every evaluation seed."""
    eval_seeds: list[Seed] = Field(min_length=1)
    """Evaluation (split) seeds."""
    metric: MetricDefinition = MetricDefinition()
    decision: DecisionRule = DecisionRule()

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in SEED_FIELDS:
            if name in self.baseline:
                raise ValueError(
                    f"`baseline` must not set `{name}`; list seeds in `train_seeds` and "
                    f"`eval_seeds` instead."
                )
        if self.mechanism.field in SEED_FIELDS:
            raise ValueError(f"`mechanism.field` cannot be a seed (`{self.mechanism.field}`).")
        if self.mechanism.field not in Config.model_fields:
            raise ValueError(
                f"`mechanism.field` is `{self.mechanism.field}`, which is not a config field; "
                f"choose one of {', '.join(f'`{k}`' for k in Config.model_fields)}."
            )
        for name, seeds in (("train_seeds", self.train_seeds), ("eval_seeds", self.eval_seeds)):
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"`{name}` repeats a seed: `{seeds}`.")
        base = self.baseline_config()
        if getattr(base, self.mechanism.field) == self.mechanism.value:
            raise ValueError(
                f"`mechanism.value` `{self.mechanism.value}` equals the baseline's "
                f"`{self.mechanism.field}`: nothing would change."
            )
        self.candidate_config()
        return self

    def baseline_config(self) -> Config:
        return Config.from_dict(dict(self.baseline), "spec baseline")

    def candidate_config(self) -> Config:
        base = self.baseline_config()
        value = self.mechanism.value
        if isinstance(getattr(base, self.mechanism.field), float):
            value = float(value)
        return base.replace(**{self.mechanism.field: value})

    def pairs(self) -> list[tuple[int, int]]:
        return list(itertools.product(self.train_seeds, self.eval_seeds))

    def arm_config(self, arm: str, train_seed: int, eval_seed: int) -> Config:
        config = self.baseline_config() if arm == "baseline" else self.candidate_config()
        return config.replace(train_seed=train_seed, eval_seed=eval_seed)

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def parse_spec(text: str, source: str = "<string>") -> Spec:
    """Parses YAML (or JSON) text into a `Spec`; raises `SpecError` naming each problem."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(f"Spec `{source}` is not valid YAML: {_yaml_problem(err)}.") from None
    if not isinstance(raw, dict):
        raise SpecError(f"Spec `{source}` must be a mapping of fields, not `{type(raw).__name__}`.")
    try:
        return Spec.model_validate(raw)
    except pydantic.ValidationError as err:
        problems = []
        for item in err.errors(include_url=False):
            where = ".".join(str(part) for part in item["loc"])
            message = item["msg"].removeprefix("Value error, ").rstrip(".")
            problems.append(f"`{where}`: {message}" if where else message)
        raise SpecError(f"Invalid comparison spec `{source}`: {'; '.join(problems)}.") from None
    except ValueError as err:  # ConfigError from the baseline or candidate config.
        raise SpecError(f"Invalid comparison spec `{source}`: {err}") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: the problem and where it is."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def load_spec(path: str | Path) -> Spec:
    """Reads a YAML spec file; raises `SpecError` naming the file or the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"Cannot read spec file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise SpecError(
            f"Cannot read spec file `{path}`: it is not UTF-8 text (byte {err.start})."
        ) from None
    return parse_spec(text, str(path))


# REGISTER AND RUN ----------------------------------------------------------


def registered_hashes(client: MlflowClient, exp_id: str, name: str) -> set[str]:
    """Every spec hash registered under `name` in the experiment."""
    runs = iter_runs(client, exp_id, filter_string=f"tags.`comparison.name` = '{name}'")
    return {
        run.data.tags["comparison.spec_sha256"]
        for run in runs
        if run.data.tags.get("comparison.role") == "parent"
    }


def check_frozen(client: MlflowClient, exp_id: str, spec: Spec) -> None:
    """Raises `FrozenSpecError` when `spec.name` is registered with other content
    [claim:registered-question-frozen]."""
    others = registered_hashes(client, exp_id, spec.name) - {spec.sha256()}
    if others:
        raise FrozenSpecError(
            f"The comparison `{spec.name}` was registered with spec hash "
            f"`{sorted(others)[0][:16]}...`, and this spec hashes to `{spec.sha256()[:16]}...`. "
            f"A registered question is frozen: give the changed spec a new `name`."
        )


@dataclass
class ComparisonRun:
    parent_run_id: str
    children: list[dict[str, Any]] = field(default_factory=list)


def run_comparison(
    client: MlflowClient,
    exp_id: str,
    spec: Spec,
    *,
    before_train: Callable[[str, int, int], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ComparisonRun:
    """Registers `spec` (a parent run) and runs every pair of arms as child runs.

    `before_train(arm, train_seed, eval_seed)` is called inside each child run
    before training; an exception it raises fails that arm only (used by the
    tests to check that a failed arm is kept and reported).
    """
    check_frozen(client, exp_id, spec)
    digits = data.load()
    tags = {
        "comparison.name": spec.name,
        "comparison.spec_sha256": spec.sha256(),
        "comparison.role": "parent",
    }
    parent = TrackedRun(client, exp_id, f"compare {spec.name}", tags=tags)
    with parent:
        client.log_text(parent.run_id, spec.canonical_json(), "spec.json")
        client.log_text(parent.run_id, yaml.safe_dump(spec.model_dump(mode="json")), "spec.yaml")
        outcome = ComparisonRun(parent.run_id)
        for train_seed, eval_seed in spec.pairs():
            for arm in ARMS:
                hook = None
                if before_train is not None:

                    def hook(_run, arm=arm, t=train_seed, e=eval_seed) -> None:
                        before_train(arm, t, e)

                child_tags = {
                    "comparison.name": spec.name,
                    "comparison.spec_sha256": spec.sha256(),
                    "comparison.role": "child",
                    "comparison.arm": arm,
                    "comparison.pair": f"t{train_seed}-e{eval_seed}",
                }
                name = f"{arm} t{train_seed} e{eval_seed}"
                try:
                    run_id, _, status = record.run_tracked(
                        client,
                        exp_id,
                        spec.arm_config(arm, train_seed, eval_seed),
                        run_name=name,
                        parent_run_id=parent.run_id,
                        tags=child_tags,
                        before_train=hook,
                        digits=digits,
                    )
                except Exception as err:  # noqa: BLE001 - the run is FAILED and kept; go on.
                    run_id = getattr(err, "run_id", "")
                    status = f"FAILED ({type(err).__name__}: {err})"
                outcome.children.append({"run": name, "run_id": run_id, "status": status})
                if progress is not None:
                    progress(f"{name}: {status}")
    return outcome


# ANALYZE -------------------------------------------------------------------


def bootstrap_ci(
    differences: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `differences` (float64 `(n,)`):
    resample n values with replacement `resamples` times, take the means'
    `(1 - confidence) / 2` and `(1 + confidence) / 2` quantiles (inverted CDF).

    Cases:
      randomness -> `np.random.default_rng(seed)` only: the same seed, the same bounds
        [claim:bootstrap-seeded].
      quantiles -> `method="inverted_cdf"`, no interpolation: the bounds are resampled
        means, so with 2 differences (-0.125, 0.25) and confidence 0.9 they are
        exactly -0.125 and 0.25 [claim:bootstrap-inverted-cdf].
      two-sided -> alpha / 2 in each tail; the alpha quantiles are too narrow
        [claim:bootstrap-two-sided].
    """
    # --- exercise stage 3: Resample means with replacement; inverted-CDF alpha/2 quantiles. ---
    rng = np.random.default_rng(seed)
    n = len(differences)
    means = differences[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return float(low), float(high)
    # --- end exercise ---


def decide(ci: tuple[float, float], higher_is_better: bool, min_difference: float) -> str:
    """`holds` when the whole interval of `candidate - baseline` lies beyond the
    minimum difference in the better direction, else `does not hold`.

    Cases (strictly beyond: touching the margin does not clear it):
      higher is better -> "holds" iff `ci[0] > min_difference`: (0.02, 0.05) with
        0.01 holds; (0.01, 0.05) with 0.01 does not [claim:decide-higher-is-better].
      lower is better -> "holds" iff `ci[1] < -min_difference` [claim:decide-lower-is-better].
    """
    # --- exercise stage 3: The whole interval must clear min_difference the better way. ---
    if higher_is_better:
        return "holds" if ci[0] > min_difference else "does not hold"
    return "holds" if ci[1] < -min_difference else "does not hold"
    # --- end exercise ---


@dataclass
class Pair:
    train_seed: int
    eval_seed: int
    baseline: float | None
    candidate: float | None
    difference: float | None
    status: str  # `complete`, or `incomplete: <why>`
    run_ids: dict[str, list[str]]


@dataclass
class Analysis:
    spec: Spec
    parent_run_id: str
    pairs: list[Pair]
    foreign_runs: list[str]
    mean: float | None
    ci: tuple[float, float] | None
    verdict: str  # `holds`, `does not hold`, `undecided: ...`

    @property
    def complete(self) -> list[Pair]:
        return [p for p in self.pairs if p.status == "complete"]

    @property
    def incomplete(self) -> list[Pair]:
        return [p for p in self.pairs if p.status != "complete"]

    def to_json(self) -> dict[str, Any]:
        return {
            "spec_name": self.spec.name,
            "spec_sha256": self.spec.sha256(),
            "question": self.spec.question,
            "parent_run_id": self.parent_run_id,
            "metric": self.spec.metric.name,
            "pairs": [vars(p) for p in self.pairs],
            "complete_pairs": len(self.complete),
            "incomplete_pairs": len(self.incomplete),
            "foreign_runs": self.foreign_runs,
            "mean_difference": self.mean,
            "ci": list(self.ci) if self.ci else None,
            "confidence": self.spec.decision.confidence,
            "verdict": self.verdict,
        }


def load_parent_spec(client: MlflowClient, parent_run_id: str) -> Spec:
    """The spec as registered on the parent run, checked against its hash tag."""
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as err:
        raise TrackingError(f"Run `{parent_run_id}` is not in the store: {err.message}") from None
    tag = parent.data.tags.get("comparison.spec_sha256")
    if parent.data.tags.get("comparison.role") != "parent" or tag is None:
        raise TrackingError(f"Run `{parent_run_id}` is not the parent run of a comparison.")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent_run_id, "spec.json", tmp)
        except (MlflowException, OSError) as err:
            raise TrackingError(
                f"Run `{parent_run_id}` has no `spec.json` artifact: {err}"
            ) from None
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise TrackingError(f"Run `{parent_run_id}`: `spec.json` is not UTF-8 text.") from None
        spec = parse_spec(text, f"{parent_run_id}/spec.json")
    if spec.sha256() != tag:
        raise TrackingError(
            f"The spec stored on `{parent_run_id}` hashes to `{spec.sha256()}`, not to its tag "
            f"`comparison.spec_sha256` (`{tag}`): the record was altered."
        )
    return spec


def _child_key(run: Any, spec: Spec) -> tuple[tuple[int, int], str]:
    """`((train seed, eval seed), arm)` of a child run of `spec`, checked: a child
    that carries the spec's hash but not a pair and an arm of it is an altered record."""
    run_id, tags, params = run.info.run_id, run.data.tags, run.data.params
    arm = tags.get("comparison.arm")
    if arm not in ARMS:
        raise TrackingError(
            f"Child run `{run_id}` has the tag `comparison.arm` = `{arm}`, not one of "
            f"{', '.join(ARMS)}: the record was altered."
        )
    seeds = []
    for name, allowed in (("train_seed", spec.train_seeds), ("eval_seed", spec.eval_seeds)):
        try:
            value = json.loads(params[name])
        except (KeyError, json.JSONDecodeError):
            value = params.get(name)
        if type(value) is not int or value not in allowed:
            raise TrackingError(
                f"Child run `{run_id}` has the param `{name}` = `{params.get(name)}`, not one "
                f"of the spec's {allowed}: the record was altered."
            )
        seeds.append(value)
    return (seeds[0], seeds[1]), arm


def analyze(client: MlflowClient, parent_run_id: str) -> Analysis:
    """Paired analysis of a comparison, from the tracking store alone."""
    spec = load_parent_spec(client, parent_run_id)
    parent = client.get_run(parent_run_id)
    children = list(
        iter_runs(
            client,
            parent.info.experiment_id,
            filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
        )
    )
    by_pair: dict[tuple[int, int], dict[str, list[Any]]] = {}
    foreign = []
    for run in children:
        tags = run.data.tags
        if tags.get("comparison.spec_sha256") != spec.sha256():
            foreign.append(run.info.run_id)
            continue
        key, arm = _child_key(run, spec)
        by_pair.setdefault(key, {name: [] for name in ARMS})[arm].append(run)
    metric = spec.metric.name
    pairs = []
    for key in spec.pairs():
        arms = by_pair.get(key, {arm: [] for arm in ARMS})
        values: dict[str, float | None] = {}
        problems = []
        for arm in ARMS:
            runs = arms[arm]
            finished = [r for r in runs if r.info.status == "FINISHED" and metric in r.data.metrics]
            if len(finished) == 1:
                values[arm] = float(finished[0].data.metrics[metric])
                continue
            values[arm] = None
            if len(finished) > 1:
                problems.append(f"{arm} has {len(finished)} finished runs")
            elif not runs:
                problems.append(f"{arm} never ran")
            else:
                last = runs[-1]
                why = last.data.tags.get("error.type") or last.data.tags.get("reconciled.reason")
                problems.append(f"{arm} {last.info.status}" + (f" ({why})" if why else ""))
        complete = not problems
        pairs.append(
            Pair(
                train_seed=key[0],
                eval_seed=key[1],
                baseline=values["baseline"],
                candidate=values["candidate"],
                difference=values["candidate"] - values["baseline"] if complete else None,
                status="complete" if complete else "incomplete: " + "; ".join(problems),
                run_ids={arm: [r.info.run_id for r in arms[arm]] for arm in ARMS},
            )
        )
    diffs = np.array([p.difference for p in pairs if p.difference is not None], np.float64)
    mean = ci = None
    rule = spec.decision
    if len(diffs):
        mean = float(diffs.mean())
        ci = bootstrap_ci(diffs, rule.confidence, rule.resamples, rule.bootstrap_seed)
    incomplete = sum(p.status != "complete" for p in pairs)
    if ci is None:
        verdict = "undecided: no complete pair"
    elif incomplete and rule.require_complete:
        verdict = f"undecided: {incomplete} of {len(pairs)} pairs incomplete"
    else:
        verdict = decide(ci, spec.metric.higher_is_better, rule.min_difference)
    return Analysis(spec, parent_run_id, pairs, foreign, mean, ci, verdict)


def decision_text(analysis: Analysis) -> str:
    rule, metric = analysis.spec.decision, analysis.spec.metric
    side = "above" if metric.higher_is_better else "below"
    margin = rule.min_difference if metric.higher_is_better else -rule.min_difference
    return (
        f"the candidate wins when the whole {rule.confidence:.0%} bootstrap interval of the "
        f"mean paired difference (candidate - baseline) in `{metric.name}` lies {side} "
        f"{margin:g}" + (", and every pair is complete" if rule.require_complete else "")
    )


def report_markdown(analysis: Analysis) -> str:
    """The comparison report: the frozen question, every pair, the verdict."""
    spec = analysis.spec
    lines = [
        f"# Comparison `{spec.name}`",
        "",
        f"**Question.** {spec.question}",
        "",
        f"- Spec sha256: `{spec.sha256()}` (tag `comparison.spec_sha256` on the parent and "
        f"on every child run)",
        f"- Parent run: `{analysis.parent_run_id}`",
        f"- Mechanism: `{spec.mechanism.field}` = `{spec.mechanism.value}` "
        f"(baseline `{getattr(spec.baseline_config(), spec.mechanism.field)}`)",
        f"- Metric: `{spec.metric.name}` "
        f"({'higher' if spec.metric.higher_is_better else 'lower'} is better)",
        f"- Decision rule: {decision_text(analysis)}.",
        "",
        "| train seed | eval seed | baseline | candidate | difference | status |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.6f}"

    for p in analysis.pairs:
        lines.append(
            f"| {p.train_seed} | {p.eval_seed} | {fmt(p.baseline)} | {fmt(p.candidate)} | "
            f"{fmt(p.difference)} | {p.status} |"
        )
    lines.append("")
    lines.append(
        f"Complete pairs: {len(analysis.complete)} of {len(analysis.pairs)}; "
        f"incomplete: {len(analysis.incomplete)} (reported, not dropped, not imputed)."
    )
    if analysis.foreign_runs:
        lines.append(
            f"Child runs with another spec hash, left out: {', '.join(analysis.foreign_runs)}."
        )
    if analysis.ci is not None:
        lines.append(
            f"Mean paired difference over complete pairs: {analysis.mean:.6f}, "
            f"{spec.decision.confidence:.0%} percentile bootstrap interval "
            f"[{analysis.ci[0]:.6f}, {analysis.ci[1]:.6f}] "
            f"({spec.decision.resamples} resamples, seed {spec.decision.bootstrap_seed})."
        )
    lines += ["", f"**Verdict: the decision rule {analysis.verdict}.**"]
    if analysis.verdict.startswith("undecided"):
        lines[-1] = f"**Verdict: {analysis.verdict}.**"
    return "\n".join(lines) + "\n"


def write_report(client: MlflowClient, analysis: Analysis, out_dir: str | Path) -> list[Path]:
    """Writes `report.md`, `paired_differences.png` and `analysis.json` into
    `out_dir` and attaches them to the parent run; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    md.write_text(report_markdown(analysis), encoding="utf-8")
    fig = plots.paired_differences(
        [f"t{p.train_seed} e{p.eval_seed}" for p in analysis.pairs],
        [p.difference for p in analysis.pairs],
        analysis.ci,
        analysis.mean,
        analysis.spec.decision.min_difference
        * (1 if analysis.spec.metric.higher_is_better else -1),
        f"{analysis.spec.name}: {analysis.spec.metric.name}, candidate - baseline",
    )
    png = out / "paired_differences.png"
    fig.savefig(png, dpi=110)
    plots.close(fig)
    js = out / "analysis.json"
    js.write_text(json.dumps(analysis.to_json(), indent=1) + "\n", encoding="utf-8")
    for path in (md, png, js):
        client.log_artifact(analysis.parent_run_id, str(path), "report")
    client.log_batch(analysis.parent_run_id, tags=[RunTag("comparison.verdict", analysis.verdict)])
    return [md, png, js]
