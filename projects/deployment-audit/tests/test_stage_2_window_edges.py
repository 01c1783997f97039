"""Stage 2: the jax.export compatibility window, exactly at its two edges.

Independent check: the rule of `export.compatibility` read literally (an older
jax's artifact is within while `now - created_at <= 180 days`, a newer jax's
while `created_at - now <= 30 days`, the running jax's always), evaluated with
exact `datetime.timedelta` comparisons, never with the float age the code
computes. Changed conditions: the age exactly at each edge and one second and
one day to either side of it; several older and newer jax versions (one patch
away, far away, and one that sorts the wrong way as text); `created_at` and
`now` in different time zones.
"""

import datetime

import jax
import pytest

from deployment_audit import export

BACKWARD = datetime.timedelta(days=180)  # The documented windows, read from the
FORWARD = datetime.timedelta(days=30)  # docstring, not from the module's constants.
HIGH = jax.export.maximum_supported_calling_convention_version  # A supported convention.
SECOND, DAY = datetime.timedelta(seconds=1), datetime.timedelta(days=1)
# The age relative to an edge: exactly on it, and one second and one day to either side.
OFFSETS = [-DAY, -SECOND, datetime.timedelta(0), SECOND, DAY]
# `created_at` in two zones (neither UTC) and `now` written in UTC: the age is a
# difference of instants, whatever zone each is written in.
CREATED = [
    datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC),
    datetime.datetime(
        2025, 3, 9, 23, 59, 59, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    ),
    datetime.datetime(2024, 2, 29, 1, 2, 3, tzinfo=datetime.timezone(-datetime.timedelta(hours=8))),
]


def _running() -> tuple[int, int, int]:
    major, minor, patch = (int(p) for p in jax.__version__.split("+")[0].split(".")[:3])
    return major, minor, patch


def _versions() -> dict[str, str]:
    """Jax versions on each side of the running one, spelled out by hand."""
    major, minor, patch = _running()
    one_older = f"{major}.{minor}.{patch - 1}" if patch else f"{major}.{minor - 1}.99"
    return {
        "same": jax.__version__,
        "older, one patch": one_older,
        "older, 0.4.30": "0.4.30",
        "older, 0.9.9 (newer as text)": "0.9.9",
        "newer, one patch": f"{major}.{minor}.{patch + 1}",
        "newer, 99.0.0": "99.0.0",
    }


def _within_by_the_rule(kind: str, age: datetime.timedelta) -> bool:
    """The documented rule, with exact timedelta comparisons (both edges inclusive)."""
    if kind == "same":
        return True
    if kind.startswith("older"):
        return age <= BACKWARD
    return -age <= FORWARD


@pytest.mark.claims(
    "compatibility-window-by-jax-version",
    "window-same-jax-always",
    "window-older-jax-180-days",
    "window-newer-jax-30-days",
    "window-each-rule-own-direction",
    "window-versions-compared-by-number",
)
@pytest.mark.parametrize("edge", ["180 days old", "30 days ahead"])
@pytest.mark.parametrize("kind", list(_versions()))
def test_both_edges_of_the_window_are_inclusive_and_crossed_by_one_second(evidence, kind, edge):
    """The verdict at, and one second and one day either side of, each window edge equals the
    documented rule evaluated with exact timedelta comparisons, for older, newer and the same jax.

    Exactly 180 days old is still within for an older jax (and exactly 30 days
    ahead for a newer one); one second more is outside. Each rule applies only
    to its own direction: a newer jax's artifact 180 days old and an older
    jax's 30 days ahead stay within, and the running jax runs its own at any
    date. For three `created_at` values in three time zones, `now` in UTC."""
    made_by = _versions()[kind]
    centre = BACKWARD if edge == "180 days old" else -FORWARD
    wrong, within = [], []
    for created in CREATED:
        for offset in OFFSETS:
            age = centre + offset
            now = (created + age).astimezone(datetime.UTC)
            manifest = {
                "created_at": created.isoformat(),
                "jax_version": made_by,
                "calling_convention_version": HIGH,
            }
            verdict = export.compatibility(manifest, now)
            expected = _within_by_the_rule(kind, age)
            within.append(verdict["within_window"])
            if verdict["within_window"] is not expected:
                wrong.append(
                    f"made by jax {made_by}, created {created.isoformat()}, age {age} "
                    f"(edge {edge}, offset {offset}): within={verdict['within_window']}, "
                    f"the rule says {expected} ({verdict['message']})"
                )
    assert evidence.record(
        "compatibility window at its edge",
        f"jax {made_by} ({kind}), {edge}, offsets -1 day, -1 s, 0, +1 s, +1 day, 3 zones",
        {"verdicts": len(within), "within": sum(within), "disagreeing": wrong},
        {"disagreements allowed with the documented rule": 0},
        not wrong,
    ), "\n".join(wrong)
