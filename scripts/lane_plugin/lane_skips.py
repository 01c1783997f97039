"""pytest plugin of the accelerator lane: the skips a lent machine calls for, each
with its reason.

A stage whose manifest declares hardware this machine does not have (the lane
decides, and passes `LANE_SKIP_FILES`: JSON, test file name -> reason) has its
tests skipped with that reason, never run.

A test that fails only because the machine refuses network sockets, or only
because a child process could not open the chip the test process holds, is
reported as skipped, with that reason.

The lent accelerator machine refuses every TCP and UDP socket, loopback included
(errno 97, EAFNOSUPPORT), so a test that serves HTTP, scrapes a metrics
endpoint, talks to a database server or starts `jax.distributed` cannot mean
anything there. Such a test fails with that errno in its report. And one
program holds a TPU at a time: once the test process has opened it, a child
process that runs JAX (a CLI run "in a fresh process", a supervised job) fails
to open it ("Unable to initialize backend 'tpu'", libtpu's lockfile), where on a
CPU every process has its own backend. This plugin turns exactly those failures
into skips that name the reason, and leaves every other failure as it is. The
lane loads it with `-p lane_skips`; CPU runs never do.
"""

from __future__ import annotations

import json
import os

import pytest

# How a refused socket shows in a failure's report: raised directly, or carried
# as a CLI result's exception (`<Result OSError(97, ...)>`).
REFUSED = ("[Errno 97]", "OSError(97,", "Address family not supported by protocol")
REASON = "needs a network socket; this machine refuses them (errno 97, EAFNOSUPPORT)"
# How a child's failure to open the chip shows when its stderr reaches the report.
CHIP_HELD = ("Unable to initialize backend 'tpu'", "libtpu multi-process lockfile")
CHIP_REASON = (
    "runs JAX in a second process, which cannot open the chip this test process "
    "holds (one program holds a TPU at a time)"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = json.loads(os.environ.get("LANE_SKIP_FILES") or "{}")
    for item in items:
        reason = reasons.get(item.path.name)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    text = str(report.longrepr)
    for markers, reason in ((REFUSED, REASON), (CHIP_HELD, CHIP_REASON)):
        if any(marker in text for marker in markers):
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
            return
