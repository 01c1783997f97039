"""Release gates: what must hold before traffic may move to a model.

`promotion_gate` (before anything is written):
  1. the model id names an object in the store (its digest checked);
  2. an approval of that model in the log, signed by a trusted key valid
     when it signed, under the policy in force, and not older than the
     policy's `approval_valid_days`;
  3. the evaluation the approval names verifies for that model on the
     policy's held-out set (metrics recomputed from its predictions);
  4. those metrics reach the policy's thresholds.
Every failed condition is collected into one `GateRefused` with the reasons.

`golden_check` (readiness): a loaded model reproduces the logits stored with
it on its golden inputs; a candidate server reports ready only after it.
"""

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engineering_release import checkpoint, evaluation, ledger, signing
from engineering_release.config import Policy
from engineering_release.store import Store, StoreError

GOLDEN_ATOL = 1e-5  # float32 logits of O(10): the same program on the same CPU gives equal bits


class GateRefused(ValueError):
    """A promotion refused; `reasons` lists every failed condition."""

    def __init__(self, model_id: str, reasons: list[str]):
        self.model_id, self.reasons = model_id, reasons
        super().__init__(f"Release of `{model_id[:12]}` refused: " + " ".join(reasons))


@dataclass
class GatePassed:
    """The evidence a passed gate stands on."""

    model_id: str
    approve_entry: dict
    verified: evaluation.Verified
    checks: list[str] = field(default_factory=list)


def thresholds(metrics: dict, policy: Policy) -> list[str]:
    """The policy thresholds `metrics` misses, as sentences; empty when all pass.

    Cases (a metric equal to its minimum passes) [claim:thresholds-minimum-passes]:
        accuracy < min_accuracy -> "Held-out accuracy <a:.4f> is below the policy's
            <min_accuracy>." [claim:thresholds-accuracy-miss]
        min_class_recall < policy.min_class_recall -> "The lowest class recall <r:.4f>
            is below the policy's <min_class_recall>." [claim:thresholds-recall-miss]
        both -> both sentences, accuracy first [claim:thresholds-both-accuracy-first]
    """
    # --- exercise stage 4: Explain every metric below the policy's minimum. ---
    misses = []
    if not metrics["accuracy"] >= policy.min_accuracy:
        misses.append(
            f"Held-out accuracy {metrics['accuracy']:.4f} is below the policy's "
            f"{policy.min_accuracy}."
        )
    if not metrics["min_class_recall"] >= policy.min_class_recall:
        misses.append(
            f"The lowest class recall {metrics['min_class_recall']:.4f} is below the policy's "
            f"{policy.min_class_recall}."
        )
    return misses
    # --- end exercise ---


def promotion_gate(
    store: Store,
    entries: list[dict],
    keyring: dict,
    policy: Policy,
    model_id: str,
    *,
    approve_entry: dict | None = None,
    now: dt.datetime | None = None,
) -> GatePassed:
    """Checks conditions 1-4 for `model_id` (with `approve_entry`, for that
    approval only: a rollback re-checks the approval of its target).

    Approvals are tried newest first; the first that passes every check wins
    [claim:gate-approvals-newest-first].
    Cases, for one approval (every failing one adds its sentence):
        `verify_approval` refuses -> its message [claim:gate-signature-refusal]
        approval of another model -> "Approval is for model `<id>`."
            [claim:gate-approval-of-another-model]
        `policy_sha256` != the policy in force -> "Approval was signed under another
            policy than the one in force." [claim:gate-policy-in-force]
        older than `approval_valid_days` -> "Approval is <d> days old; the policy allows <n>."
            [claim:gate-approval-age]
        only when none of the above: the bound report fails `load_report` or
            `verify_report` -> "Bound evaluation refused: <its message>"
            [claim:gate-bound-evaluation-verified] (and only then
            [claim:gate-evaluation-only-after-approval-checks])
        only when it verified: every `thresholds` sentence [claim:gate-thresholds]
    When none passes, `GateRefused` lists "Approval `<hash>`: <sentences>" per approval
    [claim:gate-refusal-lists-each-approval].
    """
    try:
        model_id = store.resolve(model_id)
        store.get(model_id)
    except StoreError as err:
        raise GateRefused(model_id, [str(err)]) from None
    now = now or signing.now_utc()
    candidates = [approve_entry] if approve_entry else ledger.approvals(entries, model_id)[::-1]
    if not candidates:
        raise GateRefused(model_id, ["No approval of this model is in the log."])
    reasons: list[str] = []
    for entry in candidates:
        approval = entry["body"]["approval"]
        # --- exercise stage 4: Signature, policy, age, evidence and thresholds must all hold. ---
        problems = []
        try:
            signing.verify_approval(approval, keyring)
        except (signing.SignatureRefused, KeyError, ValueError) as err:
            problems.append(str(err))
        if approval["model_id"] != model_id:
            problems.append(f"Approval is for model `{approval['model_id'][:12]}`.")
        if approval["policy_sha256"] != policy.sha256():
            problems.append("Approval was signed under another policy than the one in force.")
        age = now - signing.parse_iso(approval["signed_at"])
        if age > dt.timedelta(days=policy.approval_valid_days):
            problems.append(
                f"Approval is {age.days} days old; the policy allows "
                f"{policy.approval_valid_days:g}."
            )
        verified = None
        if not problems:
            try:
                report = evaluation.load_report(store, approval["evaluation_id"])
                verified = evaluation.verify_report(report, model_id=model_id, policy=policy)
            except (evaluation.EvaluationMismatch, StoreError) as err:
                problems.append(f"Bound evaluation refused: {err}")
        if verified is not None:
            problems += thresholds(verified.metrics, policy)
        if not problems:
            return GatePassed(
                model_id, entry, verified, checks=["signature", "evaluation", "thresholds"]
            )
        # --- end exercise ---
        reasons.append(f"Approval `{entry['hash'][:12]}`: " + " ".join(problems))
    raise GateRefused(model_id, reasons)


def golden_check(loaded: checkpoint.LoadedModel, atol: float = GOLDEN_ATOL) -> dict:
    """Runs the golden inputs through `loaded`; passes only when every prediction
    equals the stored one [claim:golden-predictions-equal] and every logit is within
    `atol` of it [claim:golden-logits-within-atol]."""
    import jax.numpy as jnp

    from engineering_release import train

    golden = loaded.artifact
    # --- exercise stage 4: Golden inputs: same predictions, logits within atol. ---
    inputs = jnp.asarray(golden.golden_inputs)
    logits = np.asarray(train.predict(loaded.graphdef, loaded.params, inputs))
    if logits.shape != golden.golden_logits.shape:
        return {"passed": False, "reason": f"logits shape {logits.shape}"}
    max_err = float(np.max(np.abs(logits.astype(np.float64) - golden.golden_logits)))
    mismatched = int(np.sum(logits.argmax(1) != golden.golden_logits.argmax(1)))
    passed = mismatched == 0 and max_err <= atol
    # --- end exercise ---
    return {
        "passed": bool(passed),
        "max_abs_error": max_err,
        "mismatched_predictions": mismatched,
        "golden_count": int(len(logits)),
        "atol": atol,
    }


def prepare_candidate(store_root: str | Path, model_id: str) -> tuple[checkpoint.LoadedModel, dict]:
    """Loads `model_id` from the store (digest checked) and runs its golden self-test."""
    store = Store(store_root)
    loaded = checkpoint.load_model(store.get(model_id))
    return loaded, golden_check(loaded)
