"""Per-round ratios, their spread and the A/A control of a bench ratio.

A ratio `<a>_vs_<b>` compares two paths timed in the same interleaved rounds.
`per_round(slow, fast)` divides round r's time of the baseline by round r's
time of the measured side (above 1: the measured side is faster);
`ratio_detail` records, for one ratio, the sentence naming its baseline, the
per-round ratios with their min, median and max, and the A/A control: the
per-round ratio of one side timed twice in the same rounds (its distance
from 1 is the noise of the machine).
"""

import statistics
from typing import Any


def per_round(baseline: list[float], measured: list[float]) -> list[float]:
    """`baseline[r] / measured[r]` for every round r; the lists pair up round by
    round and must be of one length, with every time above 0."""
    if len(baseline) != len(measured) or not baseline:
        raise ValueError(
            f"per-round ratios need two equally long, non-empty lists of times, "
            f"got {len(baseline)} and {len(measured)}."
        )
    if min(baseline) <= 0 or min(measured) <= 0:
        raise ValueError("every time must be above 0.")
    return [b / m for b, m in zip(baseline, measured, strict=True)]


def spread(values: list[float]) -> dict[str, float]:
    """min, median and max of `values`."""
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def ratio_detail(
    baseline: str, rounds: list[float], aa_rounds: list[float], aa_path: str, **extra: Any
) -> dict[str, Any]:
    """The record of one ratio: `baseline` (a sentence), `rounds` (per-round
    ratios) with `min`/`median`/`max`, `aa` (the median per-round A/A ratio of
    `aa_path` timed twice) with `aa_min`/`aa_max`, and any `extra` fields."""
    aa = spread(aa_rounds)
    return {
        "baseline": baseline,
        "rounds": rounds,
        **spread(rounds),
        "aa": aa["median"],
        "aa_path": aa_path,
        "aa_min": aa["min"],
        "aa_max": aa["max"],
        "aa_rounds": aa_rounds,
        **extra,
    }
