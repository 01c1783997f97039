"""Stage 2: reject: wrong inputs, damaged or stale artifacts, bad files at the CLI.

Independent checks: every rejection with the message it must give, next to
what raw `jax.export` does with the same input (silently converts float64;
`struct.error` on truncated bytes); the compatibility window at several ages,
jax versions and calling conventions, without an artifact and through
`load_artifact`; bad input files, out-of-range pixels and damaged inputs
through the commands a user runs (exit code 2, a message naming the input, no
traceback, nothing written). Changed conditions: truncation points, ages, jax
versions (one that sorts the wrong way as text).
"""

import datetime
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from click.testing import CliRunner

from deployment_audit import export
from deployment_audit.cli import main

OLD_JAX, NEW_JAX = "0.4.30", "99.0.0"
LOW = jax.export.minimum_supported_calling_convention_version
HIGH = jax.export.maximum_supported_calling_convention_version
CREATED = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
MINUTES = 1 / (24 * 60)


def _manifest(made_by: str | None, convention: int | None = None, created=CREATED) -> dict:
    return {
        "created_at": created if isinstance(created, str) else created.isoformat(),
        "jax_version": made_by or jax.__version__,
        "calling_convention_version": HIGH if convention is None else convention,
    }


@pytest.mark.claims(
    "compatibility-window-by-jax-version",
    "calling-convention-range",
    "window-calling-convention-range",
    "window-same-jax-always",
    "window-older-jax-180-days",
    "window-newer-jax-30-days",
    "window-each-rule-own-direction",
)
@pytest.mark.parametrize(
    ("age_days", "made_by", "convention", "within"),
    [
        (180 + 2 * MINUTES, OLD_JAX, None, False),  # just past the backward window
        (180 - 2 * MINUTES, OLD_JAX, None, True),
        (-40, OLD_JAX, None, True),  # an older jax's artifact dated ahead: no forward rule
        (200, NEW_JAX, None, True),  # a newer jax's artifact long ago: no backward rule
        (-30 - 12 * 60 * MINUTES, NEW_JAX, None, False),  # half a day past the forward window
        (-30 + 12 * 60 * MINUTES, NEW_JAX, None, True),
        (-1000, None, None, True),  # the running jax runs its own, whatever the date
        (0, None, LOW, True),
        (0, None, HIGH, True),
        (0, None, LOW - 1, False),
        (0, None, HIGH + 1, False),
    ],
)
def test_compatibility_boundaries(age_days, made_by, convention, within):
    """compatibility judges both sides of each age limit and calling-convention bound correctly.

    Both sides of every edge of the window, without an artifact: the two age
    limits (minutes and half a day from them), each rule applied only to its own
    direction, and both ends of the supported calling conventions."""
    now = CREATED + datetime.timedelta(days=age_days)
    verdict = export.compatibility(_manifest(made_by, convention), now)
    assert verdict["within_window"] is within, verdict
    assert verdict["age_days"] == round(age_days, 3)
    if within:
        assert verdict["message"] == "within the jax.export compatibility window"
    else:
        assert "window" in verdict["message"] or "outside the range" in verdict["message"]


@pytest.mark.claims("window-older-jax-180-days", "window-newer-jax-30-days")
def test_compatibility_messages_name_the_figures():
    """Out-of-window messages name the jax versions and the age in days; a created_at without time
    zone is refused."""
    ahead = export.compatibility(_manifest(NEW_JAX), CREATED - datetime.timedelta(days=40))
    assert (
        f"newer than the running jax {jax.__version__}, and is dated 40 days ahead"
        in (ahead["message"])
    )
    old = export.compatibility(_manifest(OLD_JAX), CREATED + datetime.timedelta(days=200))
    assert f"exported by jax {OLD_JAX} 200 days ago" in old["message"]
    for created in ("2026-01-01T12:00:00", "not a date"):  # no time zone; no date at all
        verdict = export.compatibility(_manifest(None, created=created), CREATED)
        assert verdict["within_window"] is False
        assert (
            f"`created_at` `{created}` is not an ISO date with a time zone" in (verdict["message"])
        )


WRONG_INPUTS = {
    "rank 1": ((np.zeros(64, np.float32),), {}, "must have rank 2"),
    "rank 3": ((np.zeros((2, 8, 8), np.float32),), {}, "must have rank 2"),
    "63 features": ((np.zeros((2, 63), np.float32),), {}, "must have 64 features"),
    "float64": ((np.zeros((2, 64), np.float64),), {}, "must be float32, but is `float64`"),
    "int32": ((np.zeros((2, 64), np.int32),), {}, "must be float32, but is `int32`"),
    "empty batch": ((np.zeros((0, 64), np.float32),), {}, "at least one row"),
    "two arguments": (
        (np.zeros((2, 64), np.float32), np.zeros((2, 64), np.float32)),
        {},
        "exactly one positional",
    ),
    "keyword argument": ((), {"x": np.zeros((2, 64), np.float32)}, "exactly one positional"),
    "a list": (([[0.0] * 64],), {}, "must be a NumPy or JAX array"),
}


@pytest.mark.claims("loader-refuses-wrong-inputs")
@pytest.mark.parametrize("case", list(WRONG_INPUTS))
def test_wrong_inputs_are_refused(evidence, artifact, case):
    """The loader refuses each of 9 wrong inputs with its message, where raw jax.export may run
    silently."""
    args, kwargs, message = WRONG_INPUTS[case]
    loaded = export.load_artifact(artifact)
    # What raw jax.export does with the same call (jitted, as deployed):
    try:
        raw = jax.jit(loaded.exported.call)(*args, **kwargs)
        raw_behaviour = f"ran silently, output {raw.dtype}{tuple(raw.shape)}"
    except Exception as err:  # noqa: BLE001 - recording what jax does, whatever it is.
        raw_behaviour = f"{type(err).__name__}"
    with pytest.raises(export.InputError, match=message) as info:
        loaded.predict(*args, **kwargs)
    evidence.record(
        "the loader refuses a wrong input with a message",
        case,
        {"raw_jax_export": raw_behaviour, "loader_message": str(info.value)},
        None,
        True,
    )
    if case == "float64":
        # The trap the loader's own check exists for: with x64 off, jax converts and runs.
        assert raw_behaviour.startswith("ran silently"), raw_behaviour


def _copy(artifact, tmp_path):
    target = tmp_path / "artifact"
    shutil.copytree(artifact, target)
    return target


@pytest.mark.claims("hash-checked-before-deserializing")
@pytest.mark.parametrize("cut", ["half", "last 10 bytes", "one byte flipped"])
def test_truncated_or_altered_bytes_are_refused_before_deserializing(
    evidence, artifact, tmp_path, cut
):
    """Halved, shortened or bit-flipped exported bytes are refused by the hash check before jax
    deserializes them."""
    target = _copy(artifact, tmp_path)
    blob = (target / export.ARTIFACT_FILE).read_bytes()
    if cut == "half":
        damaged = blob[: len(blob) // 2]
    elif cut == "last 10 bytes":
        damaged = blob[:-10]
    else:
        middle = len(blob) // 2
        damaged = blob[:middle] + bytes([blob[middle] ^ 0x01]) + blob[middle + 1 :]
    (target / export.ARTIFACT_FILE).write_bytes(damaged)
    try:
        jax.export.deserialize(bytearray(damaged))
        raw = "deserialized without error"
    except Exception as err:  # noqa: BLE001 - recording what jax does, whatever it is.
        raw = type(err).__name__
        if cut == "half":
            assert isinstance(err, struct.error), raw
    with pytest.raises(export.ArtifactError, match="truncated or altered; refusing to deserialize"):
        export.load_artifact(target)
    evidence.record(
        "damaged bytes: the hash check refuses them before deserializing",
        cut,
        {"raw_jax_export_deserialize": raw, "bytes": len(damaged), "original_bytes": len(blob)},
        None,
        True,
    )


@pytest.mark.claims(
    "loader-refuses-other-golden-or-preprocessing",
    "loader-refuses-unpinned-version",
)
def test_other_refusals(artifact, tmp_path):
    """A wrong expected sha256, altered golden sample, other preprocessing, bad or missing manifest
    are refused."""
    target = _copy(artifact, tmp_path)
    with pytest.raises(export.ArtifactError, match="expected model version"):
        export.load_artifact(target, expected_sha256="0" * 64)
    golden = json.loads((target / export.GOLDEN_FILE).read_text())
    golden["predictions"][0] = (golden["predictions"][0] + 1) % 10
    (target / export.GOLDEN_FILE).write_text(json.dumps(golden) + "\n")
    with pytest.raises(export.ArtifactError, match="golden sample .* altered"):
        export.load_artifact(target)
    manifest = json.loads((target / export.MANIFEST_FILE).read_text())
    manifest["preprocessing_version"] = "digits-pixels-v0"
    (target / export.MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(export.ArtifactError, match="expects preprocessing `digits-pixels-v0`"):
        export.load_artifact(target)
    (target / export.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(export.ArtifactError, match="not valid JSON"):
        export.load_artifact(target)
    (target / export.MANIFEST_FILE).unlink()
    with pytest.raises(export.ArtifactError, match="No readable manifest"):
        export.load_artifact(target)


OLDER_JAX, NEWER_JAX = "0.4.30", "99.0.0"
# (0, 9, 9) is older than any 0.10 release by number, newer as text.
TEXT_TRAP_JAX = "0.9.9"


@pytest.mark.claims(
    "compatibility-window-by-jax-version",
    "calling-convention-range",
    "window-calling-convention-range",
    "window-same-jax-always",
    "window-older-jax-180-days",
    "window-newer-jax-30-days",
    "window-versions-compared-by-number",
)
@pytest.mark.parametrize(
    ("age_days", "convention", "made_by", "within"),
    [
        (0, None, None, True),
        (400, None, None, True),
        (-40, None, None, True),
        (179, None, OLDER_JAX, True),
        (181, None, OLDER_JAX, False),
        (200, None, TEXT_TRAP_JAX, False),
        (-20, None, NEWER_JAX, True),
        (-40, None, NEWER_JAX, False),
        (0, 8, None, False),
    ],
)
def test_compatibility_window(evidence, artifact, tmp_path, age_days, convention, made_by, within):
    """The verdict and load_artifact follow the window: own jax always, older 180 days, newer 30.

    The window is between the jax that made the artifact and the running one:
    the running jax always runs its own artifacts, whatever their date; another
    version's artifact is judged by its age (180 days back, 30 forward)."""
    manifest = json.loads((artifact / export.MANIFEST_FILE).read_text())
    manifest["jax_version"] = made_by or jax.__version__
    if convention is not None:
        manifest = {**manifest, "calling_convention_version": convention}
    created = datetime.datetime.fromisoformat(manifest["created_at"])
    now = created + datetime.timedelta(days=age_days)
    verdict = export.compatibility(manifest, now)
    assert evidence.record(
        "jax.export compatibility window: by the jax version that made the artifact",
        f"made by jax {manifest['jax_version']} (running {jax.__version__}), age {age_days} "
        f"days, calling convention {manifest['calling_convention_version']}",
        verdict,
        {"backward_days": 180, "forward_days": 30},
        verdict["within_window"] == within,
    ), verdict
    if convention is None:
        target = _copy(artifact, tmp_path)
        (target / export.MANIFEST_FILE).write_text(json.dumps(manifest))
        if within:
            assert export.load_artifact(target, now=now).checks["compatibility"]["within_window"]
        else:
            with pytest.raises(export.StaleArtifactError, match="compatibility window"):
                export.load_artifact(target, now=now)
            flagged = export.load_artifact(target, now=now, accept_outside_window=True)
            assert flagged.checks["compatibility"]["within_window"] is False


def _bad_npy_files(folder) -> dict[str, tuple[Path, str]]:
    """Files `predict` must refuse with a message, each with the words it must say."""
    files = {}
    text = folder / "text.npy"
    text.write_text("0.0 1.0 2.0\n")
    files["text, not .npy"] = (text, "not a NumPy .npy file")
    objects = folder / "objects.npy"
    np.save(objects, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    files["object array"] = (objects, "not a NumPy .npy file")
    truncated = folder / "truncated.npy"
    np.save(truncated, np.zeros((4, 64), np.float32))
    truncated.write_bytes(truncated.read_bytes()[:100])
    files["truncated .npy"] = (truncated, "not a NumPy .npy file")
    empty = folder / "empty.npy"
    empty.write_bytes(b"")
    files["empty file"] = (empty, "not a NumPy .npy file")
    archive = folder / "archive.npy"
    with archive.open("wb") as f:
        np.savez(f, x=np.zeros((4, 64), np.float32))
    files["npz archive"] = (archive, "archive")
    wrong = folder / "float64.npy"
    np.save(wrong, np.zeros((4, 64), np.float64))
    files["float64 array"] = (wrong, "float32")
    return files


@pytest.mark.claims("predict-refuses-bad-npy-files")
def test_predict_refuses_files_that_are_not_float32_npy(evidence, artifact, tmp_path):
    """A file that is not a real `.npy` of numbers ends in exit 2 and a message
    naming the file, never a traceback. Each case through the command in this
    process; the object array again in a fresh process, as a user runs it."""
    observed = {}
    out = tmp_path / "out.npy"
    for case, (path, words) in _bad_npy_files(tmp_path).items():
        result = CliRunner().invoke(main, ["predict", str(artifact), str(path), str(out)])
        observed[case] = {
            "exit_code": result.exit_code,
            "says": words in result.output,
            "names_the_file": path.name in result.output or case == "float64 array",
            "traceback": not isinstance(result.exception, SystemExit | None),
            "message": result.output.strip()[-300:],
        }
    path, words = tmp_path / "objects.npy", "not a NumPy .npy file"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "deployment_audit.cli",
            "predict",
            str(artifact),
            str(path),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,  # A hang guard only: a loaded machine starts JAX slowly.
    )
    observed["object array, fresh process"] = {
        "exit_code": proc.returncode,
        "says": words in proc.stderr,
        "names_the_file": path.name in proc.stderr,
        "traceback": "Traceback" in proc.stderr,
        "message": proc.stderr.strip()[-300:],
    }
    assert evidence.record(
        "`predict` refuses a non-npy, object, truncated, empty, npz or float64 file",
        f"{len(observed)} bad input files",
        observed,
        {"exit_code": 2},
        all(
            o["exit_code"] == 2 and o["says"] and o["names_the_file"] and not o["traceback"]
            for o in observed.values()
        )
        and not out.exists(),
    ), observed


class _Tripwire(AssertionError):
    """Raised when work starts that a damaged input should have prevented."""


def _tripwire(what: str):
    def fire(*args, **kwargs):
        raise _Tripwire(f"{what} started")

    return fire


@pytest.mark.claims("predict-refuses-out-of-range-pixels")
def test_predict_refuses_pixels_outside_0_16_before_loading_the_artifact(
    evidence, artifact, tmp_path, monkeypatch
):
    """`predict` refuses a float32 `(n, 64)` array with one pixel outside [0, 16] (just
    below 0, just above 16, NaN, +inf, -inf) with exit code 2 and a message naming the
    file and the range, before the artifact is loaded (`export.load_artifact` is a
    tripwire here) and without writing the output; the range's ends, 0 and 16, are
    accepted and run (the real loader restored)."""
    out = tmp_path / "logits.npy"
    bad = {
        "just below 0": -0.001,
        "just above 16": float(np.nextafter(np.float32(16), np.float32(17))),
        "NaN": float("nan"),
        "+inf": float("inf"),
        "-inf": float("-inf"),
    }
    observed = {}
    with monkeypatch.context() as patch:
        patch.setattr(export, "load_artifact", _tripwire("loading the artifact"))
        for case, value in bad.items():
            x = np.full((3, 64), 8.0, np.float32)
            x[1, 37] = value
            path = tmp_path / f"pixels {case}.npy"
            np.save(path, x)
            result = CliRunner().invoke(main, ["predict", str(artifact), str(path), str(out)])
            observed[case] = {
                "exit_code": result.exit_code,
                "names_the_file": path.name in result.output,
                "says_the_range": "[0, 16]" in result.output,
                "loaded_the_artifact": isinstance(result.exception, _Tripwire),
                "traceback": not isinstance(result.exception, SystemExit | None),
                "message": result.output.strip()[-300:],
            }
    edges = np.full((2, 64), 0.0, np.float32)
    edges[1] = 16.0
    path = tmp_path / "pixels at the ends.npy"
    np.save(path, edges)
    result = CliRunner().invoke(main, ["predict", str(artifact), str(path), str(out)])
    accepted = result.exit_code == 0 and np.load(out).shape == (2, 10)
    observed["0 and 16 (accepted)"] = {"exit_code": result.exit_code, "wrote": out.exists()}
    assert evidence.record(
        "`predict` refuses pixels outside [0, 16] before loading the artifact",
        f"{len(bad)} arrays with one bad pixel; one at the range's ends",
        observed,
        {"exit_code": 2, "ends_accepted": True},
        all(
            o["exit_code"] == 2
            and o["names_the_file"]
            and o["says_the_range"]
            and not o["loaded_the_artifact"]
            and not o["traceback"]
            for case, o in observed.items()
            if case in bad
        )
        and accepted,
    ), observed


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a folder)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.claims("bad-inputs-one-line-errors")
def test_damaged_inputs_get_one_error_line_naming_them_and_nothing_written(
    evidence, artifact, tmp_path, monkeypatch
):
    """One damaged input of each kind, through the command a user runs: a config
    file that is not JSON (`train`), a manifest field of the wrong type and a
    truncated golden sample (`verify`), an empty `.npy` input and an output path
    under a file (`predict`), a pinned hash that is no sha256 (`verify
    --expect-sha256`), a workdir with no trained model (`export`). Each ends in exit
    code 2 with one `Error:` line, the last line of the output, that names the
    input, no traceback, and the workspace (the damaged copies included) byte for
    byte as before. Training is a tripwire here, so a config that passed would fail
    its case instead of training."""
    from deployment_audit import train as train_module

    monkeypatch.setattr(train_module, "train_and_evaluate", _tripwire("training"))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a_file").write_text("not a folder\n")
    config = ws / "config.json"
    config.write_text("seed = 0\n")
    typed = ws / "typed"
    shutil.copytree(artifact, typed)
    manifest = json.loads((typed / export.MANIFEST_FILE).read_text())
    manifest["sha256"] = 5
    (typed / export.MANIFEST_FILE).write_text(json.dumps(manifest))
    cut = ws / "cut"
    shutil.copytree(artifact, cut)
    golden = (cut / export.GOLDEN_FILE).read_bytes()
    (cut / export.GOLDEN_FILE).write_bytes(golden[: len(golden) // 2])
    empty = ws / "empty.npy"
    empty.write_bytes(b"")
    good = ws / "good.npy"
    np.save(good, np.full((2, 64), 3.0, np.float32))
    (ws / "untrained").mkdir()
    cases = {
        "config not JSON (train)": (
            ["train", "--config", config, "--workdir", ws / "run"],
            config.name,
        ),
        "manifest field of the wrong type (verify)": (["verify", typed], "`sha256`"),
        "truncated golden sample (verify)": (["verify", cut], export.GOLDEN_FILE),
        "empty .npy input (predict)": (["predict", artifact, empty, ws / "o.npy"], empty.name),
        "output path under a file (predict)": (
            ["predict", artifact, good, ws / "a_file" / "o.npy"],
            "a_file",
        ),
        "pinned hash not a sha256 (verify)": (
            ["verify", artifact, "--expect-sha256", "abc123"],
            "abc123",
        ),
        "workdir without a trained model (export)": (["export", ws / "untrained"], "untrained"),
    }
    observed = {}
    for case, (args, needle) in cases.items():
        before = _tree(ws)
        result = CliRunner().invoke(main, [str(a) for a in args])
        lines = [line for line in result.output.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("Error:")]
        observed[case] = {
            "exit_code": result.exit_code,
            "error_lines": len(errors),
            "error_is_last_line": bool(lines) and bool(errors) and lines[-1] == errors[0],
            "names_the_input": bool(errors) and needle in errors[0],
            "traceback": "Traceback" in result.output
            or not isinstance(result.exception, SystemExit | None),
            "nothing_written": _tree(ws) == before,
            "error": errors[0][:300] if errors else result.output[-300:],
        }
    assert evidence.record(
        "a damaged input: one error line naming it, exit 2, nothing written",
        f"{len(cases)} damaged inputs through train, verify, predict and export",
        observed,
        {"exit_code": 2, "error_lines": 1},
        all(
            o["exit_code"] == 2
            and o["error_lines"] == 1
            and o["error_is_last_line"]
            and o["names_the_input"]
            and not o["traceback"]
            and o["nothing_written"]
            for o in observed.values()
        ),
    ), observed
