"""The exported artifact: `jax.export` bytes, a manifest, and a loader that
checks everything before it runs anything.

An artifact directory holds
  `model.jaxexport`  `Exported.serialize()` of raw pixels float32 `(b, 64)` ->
                     logits float32 `(b, 10)`, with a symbolic batch `b`; the
                     preprocessing and the weights are inside the module.
  `golden.json`      the golden sample of stage 1 (inputs, logits, predictions).
  `manifest.json`    sha256 and size of the bytes, the input and output
                     signatures, the preprocessing version and its sha256, the
                     label map, jax/jaxlib versions, platforms, calling
                     convention version, creation date (UTC), golden sha256.

`load_artifact` refuses, each with an `ArtifactError` that says why: a missing
or malformed manifest; bytes whose sha256 is not the manifest's (checked
BEFORE deserializing: a truncated artifact otherwise fails deep inside the
flatbuffer reader with a raw `struct.error`); bytes that do not match a pinned
hash; a calling convention this jax cannot run; bytes whose signature is not
the manifest's; and an artifact outside the jax.export compatibility window
(`StaleArtifactError`, unless the caller accepts it, which is then recorded).

``LoadedArtifact.predict` refuses wrong inputs with an `InputError`: wrong
argument structure, a non-array, wrong rank, wrong feature count, an empty
batch, a dtype other than float32, or a pixel outside [0, 16] (NaN included).
The dtype check is the loader's own: with x64 off, jax silently converts a
float64 array to float32 and runs.
"""

import datetime
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from deployment_audit import data
from deployment_audit.model import Params, logits_from_raw

ARTIFACT_FILE = "model.jaxexport"
MANIFEST_FILE = "manifest.json"
GOLDEN_FILE = "golden.json"
MANIFEST_FORMAT = "deployment-audit-manifest/1"
# jax.export inherits StableHLO's guarantees: an artifact serialized by one
# version can be run by versions released up to 6 months later (backward), and
# by versions up to 1 month OLDER (forward). Source: StableHLO
# docs/compatibility.md and https://docs.jax.dev/en/latest/export/export.html
# ("Compatibility guarantees"). The windows are between jax RELEASES: what
# decides is the jax version that made the artifact (the manifest's
# `jax_version`) against the running one. The same version always runs what it
# exported. For another version, the artifact's date bounds the distance
# between the two releases: an older jax's artifact is refused once it is more
# than 180 days old; one made by a NEWER jax than the running one is refused
# unless it is dated at most 30 days from now.
BACKWARD_WINDOW_DAYS = 180
FORWARD_WINDOW_DAYS = 30
# Raw pixel intensities of scikit-learn's digits (`data.INPUT_LAYOUT`).
PIXEL_MAX = 16.0
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
INPUT_SIGNATURE = {
    "args": [{"name": "x", "shape": ["b", data.NUM_FEATURES], "dtype": "float32"}],
    "kwargs": {},
}


class ArtifactError(ValueError):
    """An artifact that must not be loaded; the message says why."""


class StaleArtifactError(ArtifactError):
    """An artifact outside the jax.export compatibility window."""


class InputError(ValueError):
    """An input that does not match the artifact's signature; the message says how."""


def export_model(params: Params, preprocessing: dict[str, Any]) -> jax.export.Exported:
    """Lowers the deployed function with a symbolic batch dimension `b >= 1`."""
    mean, scale = (jnp.asarray(a) for a in data.spec_arrays(preprocessing))

    def deployed(x: jax.Array) -> jax.Array:
        return logits_from_raw(params, mean, scale, x)

    (b,) = jax.export.symbolic_shape("b")
    spec = jax.ShapeDtypeStruct((b, data.NUM_FEATURES), jnp.float32)
    return jax.export.export(jax.jit(deployed))(spec)


def sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _json_sha256(value: Any) -> str:
    return sha256(json.dumps(value, sort_keys=True).encode())


def _signature(avals: Any) -> list[dict[str, Any]]:
    return [
        {"shape": [d if isinstance(d, int) else str(d) for d in a.shape], "dtype": str(a.dtype)}
        for a in avals
    ]


def write_artifact(
    out_dir: str | Path,
    exported: jax.export.Exported,
    spec: dict[str, Any],
    golden: dict[str, Any],
    *,
    created_at: datetime.datetime | None = None,
) -> dict[str, Any]:
    """Serializes `exported` into `out_dir` with its manifest and golden sample.

    `spec` is the stage-1 spec (`preprocessing`, `labels`, `config`). Returns the manifest.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blob = bytes(exported.serialize())
    golden_text = json.dumps(golden) + "\n"
    created_at = created_at or datetime.datetime.now(datetime.UTC)
    manifest = {
        "format": MANIFEST_FORMAT,
        "artifact_file": ARTIFACT_FILE,
        "sha256": sha256(blob),
        "size_bytes": len(blob),
        "input_signature": INPUT_SIGNATURE,
        "exported_in_avals": _signature(exported.in_avals),
        "exported_out_avals": _signature(exported.out_avals),
        "preprocessing_version": spec["preprocessing"]["version"],
        "preprocessing_sha256": _json_sha256(spec["preprocessing"]),
        "input_layout": spec["preprocessing"]["input_layout"],
        "labels": list(spec["labels"]),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "platforms": list(exported.platforms),
        "calling_convention_version": exported.calling_convention_version,
        "created_at": created_at.isoformat(timespec="seconds"),
        "golden_file": GOLDEN_FILE,
        "golden_sha256": sha256(golden_text.encode()),
        "model_config": spec["config"],
    }
    (out_dir / ARTIFACT_FILE).write_bytes(blob)
    (out_dir / GOLDEN_FILE).write_text(golden_text)
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


@dataclass
class LoadedArtifact:
    """A verified artifact, ready to run. `checks` records what was verified."""

    path: Path
    manifest: dict[str, Any]
    exported: jax.export.Exported
    golden: dict[str, Any]
    checks: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # exported.call outside jax.jit is several times slower: always call it jitted.
        self._call = jax.jit(self.exported.call)

    @property
    def labels(self) -> list[str]:
        return self.manifest["labels"]

    def predict(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """Logits float32 `(batch, 10)` for raw pixels float32 `(batch, 64)`."""
        x = check_input(*args, **kwargs)
        return np.asarray(self._call(x))

    def self_test(self) -> dict[str, Any]:
        """Runs the golden inputs: predictions must equal the golden ones exactly
        and logits agree to 1e-5 (bitwise equality is recorded, not required:
        another CPU may round float32 sums differently)."""
        inputs = np.asarray(self.golden["inputs"], np.float32)
        expected = np.asarray(self.golden["logits"], np.float32)
        logits = self.predict(inputs)
        result = {
            "count": len(inputs),
            "predictions_equal": logits.argmax(axis=1).tolist() == self.golden["predictions"],
            "max_abs_logit_error": float(np.abs(logits - expected).max()),
            "bitwise_equal": bool(np.array_equal(logits.view(np.uint32), expected.view(np.uint32))),
        }
        result["passed"] = result["predictions_equal"] and result["max_abs_logit_error"] <= 1e-5
        return result


def check_input(*args: Any, **kwargs: Any) -> np.ndarray | jax.Array:
    """The artifact's input check, apart from running it. Returns the array `x`."""
    if kwargs or len(args) != 1:
        given = f"{len(args)} positional and {sorted(kwargs) or 'no'} keyword arguments"
        raise InputError(f"The model takes exactly one positional argument `x`, but got {given}.")
    (x,) = args
    if not isinstance(x, np.ndarray | jax.Array):
        raise InputError(
            f"`x` must be a NumPy or JAX array of float32, but got a `{type(x).__name__}`."
        )
    if x.ndim != 2:
        raise InputError(
            f"`x` must have rank 2 `(batch, {data.NUM_FEATURES})`, but has shape `{x.shape}`."
        )
    if x.shape[1] != data.NUM_FEATURES:
        raise InputError(
            f"`x` must have {data.NUM_FEATURES} features per row (an 8x8 image flattened "
            f"row-major), but has shape `{x.shape}`."
        )
    if x.shape[0] < 1:
        raise InputError("`x` must hold at least one row, but its batch dimension is 0.")
    if x.dtype != np.float32:
        raise InputError(
            f"`x` must be float32, but is `{x.dtype}`; convert it explicitly "
            f"(jax would otherwise convert it silently)."
        )
    if isinstance(x, jax.core.Tracer):
        return x  # Inside `jit`: no values to check yet.
    values = np.asarray(x)
    finite = values[np.isfinite(values)]
    if finite.size < values.size or finite.min() < 0.0 or finite.max() > PIXEL_MAX:
        span = f"[{finite.min():g}, {finite.max():g}]" if finite.size else "no finite value"
        bad = values.size - finite.size
        raise InputError(
            f"Pixels must be raw intensities in [0, {PIXEL_MAX:g}] (the artifact's input "
            f"layout: {data.INPUT_LAYOUT}), but the values span {span}"
            + (f" and {bad} are NaN or infinite." if bad else ".")
        )
    return x


def load_artifact(
    path: str | Path,
    *,
    expected_sha256: str | None = None,
    now: datetime.datetime | None = None,
    accept_outside_window: bool = False,
) -> LoadedArtifact:
    """Verifies and loads the artifact directory `path` (see the module docstring).

    Args:
      expected_sha256: if given, the bytes must have exactly this hash (a pinned
        model version), whatever the manifest says.
      now: the date to measure the artifact's age against (default: now, UTC).
      accept_outside_window: load a stale artifact anyway; `checks` records it.
    """
    path = Path(path)
    if expected_sha256 is not None and (
        not isinstance(expected_sha256, str) or not SHA256_HEX.fullmatch(expected_sha256)
    ):
        raise ArtifactError(
            f"The expected sha256 `{expected_sha256}` is not 64 lowercase hexadecimal digits, "
            f"so no artifact could ever match it."
        )
    manifest = _read_manifest(path)
    blob_path = path / manifest["artifact_file"]
    try:
        blob = blob_path.read_bytes()
    except OSError as err:
        raise ArtifactError(
            f"Cannot read the artifact bytes `{blob_path}`: {err.strerror}."
        ) from None
    actual = sha256(blob)
    if actual != manifest["sha256"]:
        raise ArtifactError(
            f"The bytes of `{blob_path}` ({len(blob)} bytes, sha256 `{actual[:16]}...`) are not "
            f"the ones the manifest describes ({manifest['size_bytes']} bytes, sha256 "
            f"`{manifest['sha256'][:16]}...`): the artifact was truncated or altered; "
            f"refusing to deserialize it."
        )
    if len(blob) != manifest["size_bytes"]:
        raise ArtifactError(
            f"The bytes of `{blob_path}` match the manifest's sha256 but are {len(blob)} bytes, "
            f"not the manifest's `size_bytes` {manifest['size_bytes']}: the manifest is "
            f"inconsistent."
        )
    if expected_sha256 is not None and actual != expected_sha256:
        raise ArtifactError(
            f"The artifact `{blob_path}` has sha256 `{actual[:16]}...`, but the expected model "
            f"version is `{expected_sha256[:16]}...`: this is another model."
        )
    checks: dict[str, Any] = {"sha256": actual, "sha256_matches_manifest": True}
    checks["compatibility"] = compatibility(manifest, now)
    if not checks["compatibility"]["within_window"] and not accept_outside_window:
        raise StaleArtifactError(checks["compatibility"]["message"])
    golden = _read_golden(path, manifest)
    try:
        exported = jax.export.deserialize(bytearray(blob))
    except Exception as err:  # noqa: BLE001 - any failure here means the bytes are unusable.
        raise ArtifactError(
            f"The artifact `{blob_path}` matches its manifest but cannot be deserialized by "
            f"jax {jax.__version__} ({type(err).__name__}: {err})."
        ) from err
    if (
        _signature(exported.in_avals) != manifest["exported_in_avals"]
        or _signature(exported.out_avals) != manifest["exported_out_avals"]
    ):
        raise ArtifactError(
            f"The artifact `{blob_path}` has signature {_signature(exported.in_avals)} -> "
            f"{_signature(exported.out_avals)}, not the manifest's "
            f"{manifest['exported_in_avals']} -> {manifest['exported_out_avals']} "
            f"(`exported_in_avals` -> `exported_out_avals`)."
        )
    for key, value in (
        ("platforms", list(exported.platforms)),
        ("calling_convention_version", exported.calling_convention_version),
    ):
        if manifest[key] != value:
            raise ArtifactError(
                f"The artifact `{blob_path}` has {key} `{value}`, but its manifest says "
                f"`{manifest[key]}`."
            )
    if exported.out_avals[0].shape[-1] != len(manifest["labels"]):
        raise ArtifactError(
            f"The model gives {exported.out_avals[0].shape[-1]} logits but the manifest's label "
            f"map has {len(manifest['labels'])} entries."
        )
    return LoadedArtifact(path, manifest, exported, golden, checks)


# Every field the loader reads, with its JSON type.
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "artifact_file": str,
    "sha256": str,
    "size_bytes": int,
    "input_signature": dict,
    "exported_in_avals": list,
    "exported_out_avals": list,
    "preprocessing_version": str,
    "labels": list,
    "jax_version": str,
    "platforms": list,
    "calling_convention_version": int,
    "created_at": str,
    "golden_file": str,
    "golden_sha256": str,
}


def _read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = path / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ArtifactError(
            f"No readable manifest at `{manifest_path}` ({err.strerror}); an artifact without "
            f"its manifest cannot be verified."
        ) from None
    except ValueError as err:
        raise ArtifactError(f"The manifest `{manifest_path}` is not valid JSON: {err}.") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"The manifest `{manifest_path}` is not a JSON object.")
    missing = [key for key in _REQUIRED if key not in manifest]
    if missing:
        raise ArtifactError(f"The manifest `{manifest_path}` lacks the fields {missing}.")
    for key, kind in _REQUIRED.items():
        value = manifest[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ArtifactError(
                f"The manifest `{manifest_path}` field `{key}` must be a JSON "
                f"{_JSON_NAMES[kind]}, but is `{json.dumps(value)[:60]}`."
            )
    for key in ("artifact_file", "golden_file"):
        name = manifest[key]
        if name in ("", ".", "..") or Path(name).name != name:
            raise ArtifactError(
                f"The manifest `{manifest_path}` field `{key}` must name a file inside the "
                f"artifact directory, but is `{name}`."
            )
    for key in ("sha256", "golden_sha256"):
        if not SHA256_HEX.fullmatch(manifest[key]):
            raise ArtifactError(
                f"The manifest `{manifest_path}` field `{key}` is not a sha256 (64 lowercase "
                f"hexadecimal digits): `{manifest[key][:70]}`."
            )
    if not manifest["labels"] or not all(isinstance(label, str) for label in manifest["labels"]):
        raise ArtifactError(
            f"The manifest `{manifest_path}` field `labels` must list the class names as strings."
        )
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", manifest["jax_version"]):
        raise ArtifactError(
            f"The manifest `{manifest_path}` field `jax_version` is not a jax version like "
            f"`0.10.2`: `{manifest['jax_version'][:40]}`; the compatibility window needs it."
        )
    if manifest["input_signature"] != INPUT_SIGNATURE:
        raise ArtifactError(
            f"The manifest `{manifest_path}` field `input_signature` declares "
            f"`{json.dumps(manifest['input_signature'])[:80]}`, not this model's "
            f"`{json.dumps(INPUT_SIGNATURE)}`."
        )
    if manifest["format"] != MANIFEST_FORMAT:
        raise ArtifactError(
            f"The manifest `{manifest_path}` has format `{manifest['format']}`, not "
            f"`{MANIFEST_FORMAT}`."
        )
    if manifest["preprocessing_version"] != data.PREPROCESSING_VERSION:
        raise ArtifactError(
            f"The artifact expects preprocessing `{manifest['preprocessing_version']}`, but this "
            f"code implements `{data.PREPROCESSING_VERSION}`."
        )
    return manifest


_JSON_NAMES = {str: "string", int: "integer", dict: "object", list: "array"}


def _read_golden(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    golden_path = path / manifest["golden_file"]
    try:
        text = golden_path.read_bytes()
    except OSError as err:
        raise ArtifactError(
            f"Cannot read the golden sample `{golden_path}`: {err.strerror}."
        ) from None
    if sha256(text) != manifest["golden_sha256"]:
        raise ArtifactError(
            f"The golden sample `{golden_path}` is not the one the manifest describes "
            f"(sha256 mismatch): it was altered."
        )
    try:
        golden = json.loads(text)
    except ValueError as err:
        raise ArtifactError(
            f"The golden sample `{golden_path}` is not valid JSON: {err}."
        ) from None
    problem = _golden_problem(golden, len(manifest["labels"]))
    if problem:
        raise ArtifactError(f"The golden sample `{golden_path}` {problem}.")
    return golden


def _golden_problem(golden: Any, num_labels: int) -> str:
    """What is wrong with the structure of a golden sample, or `""`."""
    if not isinstance(golden, dict) or not {"inputs", "logits", "predictions"} <= set(golden):
        return "must be a JSON object with `inputs`, `logits` and `predictions`"
    try:
        inputs = np.asarray(golden["inputs"], np.float64)
        logits = np.asarray(golden["logits"], np.float64)
    except (TypeError, ValueError):
        return "must hold rectangular arrays of numbers as `inputs` and `logits`"
    rows = inputs.shape[0] if inputs.ndim == 2 else 0
    if rows < 1 or inputs.shape != (rows, data.NUM_FEATURES):
        return f"`inputs` must have shape (n, {data.NUM_FEATURES}), n >= 1, not `{inputs.shape}`"
    if logits.shape != (rows, num_labels):
        return f"`logits` must have shape ({rows}, {num_labels}), not `{logits.shape}`"
    if not (np.all(np.isfinite(inputs)) and inputs.min() >= 0 and inputs.max() <= PIXEL_MAX):
        return f"`inputs` must be pixels in [0, {PIXEL_MAX:g}]"
    predictions = golden["predictions"]
    if (
        not isinstance(predictions, list)
        or len(predictions) != rows
        or not all(isinstance(p, int) and not isinstance(p, bool) for p in predictions)
    ):
        return f"`predictions` must list {rows} integer classes"
    return ""


def version_key(version: str) -> tuple[int, ...]:
    """`0.10.2` -> `(0, 10, 2)`: versions compare by number, not as text."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def compatibility(manifest: dict[str, Any], now: datetime.datetime | None = None) -> dict[str, Any]:
    """Where the artifact stands in the jax.export compatibility window.

    Flags: a calling convention version this jax does not support; an artifact
    older than `BACKWARD_WINDOW_DAYS`; one dated more than `FORWARD_WINDOW_DAYS`
    in the future (made by a newer jax than this one can be trusted to run).

    Cases, first match wins (`age_days` = now - created_at, in days; versions
    compared with `version_key`, by number: "0.9.9" is older than "0.10.0"
    [claim:window-versions-compared-by-number]):
        calling convention outside [min, max] supported (both ends allowed) -> outside,
            "... calling convention <v>, outside the range <lo>..<hi> ..."
            [claim:window-calling-convention-range]
        made by the running jax -> within, whatever the date [claim:window-same-jax-always]
        made by an older jax, `age_days > 180` -> outside, "The artifact was exported
            by jax <v> <age:.0f> days ago, ..." (exactly 180 days is within)
            [claim:window-older-jax-180-days]
        made by a newer jax, `age_days < -30` -> outside, "... newer than the running jax
            <v>, and is dated <days:.0f> days ahead: ..." (exactly 30 ahead is within)
            [claim:window-newer-jax-30-days]
        anything else (an older jax's artifact dated ahead, a newer one's long ago) -> within
            [claim:window-each-rule-own-direction]
    """
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        created = datetime.datetime.fromisoformat(manifest["created_at"])
    except (TypeError, ValueError):
        created = None
    if created is None or created.tzinfo is None:
        return {
            "within_window": False,
            "message": f"The manifest's `created_at` `{manifest['created_at']}` is not an ISO "
            f"date with a time zone, so the artifact's age cannot be checked.",
        }
    age_days = (now - created).total_seconds() / 86400.0
    made_by, running = manifest["jax_version"], jax.__version__
    version = manifest["calling_convention_version"]
    low = jax.export.minimum_supported_calling_convention_version
    high = jax.export.maximum_supported_calling_convention_version
    result = {
        "age_days": round(age_days, 3),
        "backward_window_days": BACKWARD_WINDOW_DAYS,
        "forward_window_days": FORWARD_WINDOW_DAYS,
        "calling_convention_version": version,
        "supported_calling_conventions": [low, high],
        "artifact_jax": made_by,
        "runtime_jax": running,
    }
    # --- exercise stage 2: Same jax runs its own; older jax: 180 days; newer jax: 30. ---
    if not low <= version <= high:
        message = (
            f"The artifact uses calling convention {version}, outside the range {low}..{high} "
            f"that jax {running} supports; re-export it."
        )
    elif version_key(made_by) == version_key(running):
        message = ""  # Made by the running jax: no release lies between them.
    elif version_key(made_by) < version_key(running) and age_days > BACKWARD_WINDOW_DAYS:
        message = (
            f"The artifact was exported by jax {made_by} {age_days:.0f} days ago, and jax "
            f"{running} runs here: beyond the {BACKWARD_WINDOW_DAYS}-day jax.export backward "
            f"compatibility window; re-export it from the checkpoint."
        )
    elif version_key(made_by) > version_key(running) and age_days < -FORWARD_WINDOW_DAYS:
        message = (
            f"The artifact was exported by jax {made_by}, newer than the running jax "
            f"{running}, and is dated {-age_days:.0f} days ahead: beyond the "
            f"{FORWARD_WINDOW_DAYS}-day forward compatibility window; upgrade jax."
        )
    else:
        message = ""
    # --- end exercise ---
    result["within_window"] = not message
    result["message"] = message or "within the jax.export compatibility window"
    return result
