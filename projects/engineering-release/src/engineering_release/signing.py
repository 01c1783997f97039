"""Signed approvals: Ed25519 over (model id, evaluation id, policy).

A signing key is a private key file (PEM, PKCS#8, mode 0600) plus an entry
in the keyring `trusted.json`: key id -> raw public key (base64), owner name
and validity window (`not_before`, `not_after`, ISO-8601 UTC). The key id is
the first 16 hex digits of the sha256 of the raw public key.

An approval is the canonical JSON of
`{model_id, evaluation_id, policy, policy_sha256, key_id, signer, signed_at}`
and the signature over exactly those bytes. It verifies only if the key is in
the keyring, `signed_at` lies in the key's validity window, and the signature
checks against the keyring's public key (never a key the approval carries).
"""

import base64
import binascii
import datetime as dt
import hashlib
import json
import math
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engineering_release import durable
from engineering_release.config import Policy, canonical_json, shown

KEYRING = "trusted.json"
MAX_VALID_DAYS = 36_500.0


class SignatureRefused(ValueError):
    """An approval whose signature, key or binding cannot be accepted."""


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(raw_public(public)).hexdigest()[:16]


_KEY_FIELDS = ("name", "public_key", "not_before", "not_after")


def read_keyring(keys_dir: Path) -> dict:
    """The keyring `keys_dir/trusted.json` (empty if there is none); raises
    `SignatureRefused` naming the file and the entry when it is malformed."""
    path = Path(keys_dir) / KEYRING
    if not path.exists():
        return {}
    try:
        ring = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise SignatureRefused(f"Cannot read the keyring `{path}`: {err.strerror}.") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SignatureRefused(f"The keyring `{path}` is not UTF-8 JSON.") from None
    if not isinstance(ring, dict):
        raise SignatureRefused(
            f"The keyring `{path}` is a JSON {type(ring).__name__}, not an object."
        )
    for kid, entry in ring.items():
        if not isinstance(entry, dict) or sorted(entry) != sorted(_KEY_FIELDS):
            raise SignatureRefused(
                f"Key `{kid}` of the keyring `{path}` must have exactly the fields "
                f"{list(_KEY_FIELDS)}."
            )
        for name in _KEY_FIELDS:
            if not isinstance(entry[name], str):
                raise SignatureRefused(f"Key `{kid}` of `{path}`: `{name}` is not text.")
        try:
            parse_iso(entry["not_before"]), parse_iso(entry["not_after"])
            raw = base64.b64decode(entry["public_key"], validate=True)
            Ed25519PublicKey.from_public_bytes(raw)
        except (ValueError, binascii.Error):
            raise SignatureRefused(
                f"Key `{kid}` of the keyring `{path}` has a malformed validity time or "
                f"public key (ISO-8601 UTC times, a base64 raw Ed25519 key)."
            ) from None
    return ring


def _write_keyring(keys_dir: Path, ring: dict) -> None:
    text = json.dumps(ring, indent=1, sort_keys=True) + "\n"
    durable.write_atomic(Path(keys_dir) / KEYRING, text.encode())


def generate_key(
    keys_dir: str | Path,
    name: str,
    *,
    valid_days: float = 365.0,
    not_before: dt.datetime | None = None,
    trust: bool = True,
) -> tuple[str, Path]:
    """A new Ed25519 key `name`; writes `<name>.pem` and (with `trust`) adds it to
    the keyring. Returns `(key_id, pem_path)`. Holds the lock of the state that
    `keys_dir` belongs to while it reads and rewrites the keyring; checks
    everything before it writes anything."""
    if not (isinstance(valid_days, int | float) and math.isfinite(valid_days)):
        raise SignatureRefused(f"`valid_days` must be a finite number of days, not {valid_days}.")
    if not 0 < valid_days <= MAX_VALID_DAYS:
        raise SignatureRefused(
            f"`valid_days` is {valid_days}; a key is valid for more than 0 and at most "
            f"{MAX_VALID_DAYS:g} days."
        )
    if not name or not name.replace("-", "").replace("_", "").isalnum() or not name.isascii():
        raise SignatureRefused(
            f"Key name `{shown(name)}` must be ASCII letters, digits, `-` and `_`."
        )
    keys_dir = Path(keys_dir)
    keys_dir.mkdir(parents=True, exist_ok=True)
    with durable.locked(keys_dir.parent / durable.LOCK_FILE):
        pem_path = keys_dir / f"{name}.pem"
        if pem_path.exists():
            raise SignatureRefused(f"A key named `{name}` already exists at `{pem_path}`.")
        ring = read_keyring(keys_dir) if trust else {}
        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        kid = key_id(private.public_key())
        start = not_before or now_utc()
        window = {"not_before": iso(start), "not_after": iso(start + dt.timedelta(days=valid_days))}
        fd = os.open(pem_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        durable.fsync_dir(keys_dir)
        if trust:
            ring[kid] = {
                "name": name,
                "public_key": base64.b64encode(raw_public(private.public_key())).decode(),
                **window,
            }
            _write_keyring(keys_dir, ring)
    return kid, pem_path


def load_private(pem_path: str | Path) -> Ed25519PrivateKey:
    try:
        raw = Path(pem_path).read_bytes()
    except OSError as err:
        raise SignatureRefused(
            f"Cannot read the signing key `{pem_path}`: {err.strerror}."
        ) from None
    if not raw.isascii():
        raise SignatureRefused(f"The signing key `{pem_path}` is not PEM text (non-ASCII bytes).")
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SignatureRefused(f"Cannot read the signing key `{pem_path}`: {reason}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureRefused(f"`{pem_path}` is not an Ed25519 private key.")
    return key


def approval_payload(approval: dict) -> bytes:
    """The exact bytes an approval's signature covers."""
    fields = (
        "model_id",
        "evaluation_id",
        "policy",
        "policy_sha256",
        "key_id",
        "signer",
        "signed_at",
    )
    return canonical_json({name: approval[name] for name in fields})


def sign_approval(
    private: Ed25519PrivateKey,
    *,
    model_id: str,
    evaluation_id: str,
    policy: Policy,
    signer: str,
    signed_at: dt.datetime | None = None,
) -> dict:
    """An approval of `model_id` as judged by `evaluation_id` under `policy`.

    Its fields: `model_id`, `evaluation_id`, `policy` (`policy.to_dict()`),
    `policy_sha256` (`policy.sha256()`), `key_id`, `signer`, `signed_at`
    (`iso`: "YYYY-MM-DDTHH:MM:SSZ", now when not given), and `signature`: base64 of
    the Ed25519 signature over `approval_payload` of the other fields
    [claim:approval-fields-and-signature].
    """
    # --- exercise stage 3: Sign the canonical bytes of the approval's fields. ---
    approval = {
        "model_id": model_id,
        "evaluation_id": evaluation_id,
        "policy": policy.to_dict(),
        "policy_sha256": policy.sha256(),
        "key_id": key_id(private.public_key()),
        "signer": signer,
        "signed_at": iso(signed_at or now_utc()),
    }
    approval["signature"] = base64.b64encode(private.sign(approval_payload(approval))).decode()
    return approval
    # --- end exercise ---


def _check_approval_fields(approval: object) -> None:
    """Refuses an approval that lacks a field or holds one of the wrong type."""
    if not isinstance(approval, dict):
        raise SignatureRefused(f"An approval is a JSON object, not a {type(approval).__name__}.")
    text = ("model_id", "evaluation_id", "policy_sha256", "key_id", "signer", "signed_at")
    for name in (*text, "signature"):
        if not isinstance(approval.get(name), str):
            raise SignatureRefused(f"The approval's `{name}` is missing or not text.")
    if not isinstance(approval.get("policy"), dict):
        raise SignatureRefused("The approval's `policy` is missing or not an object.")
    try:
        parse_iso(approval["signed_at"])
    except ValueError:
        raise SignatureRefused(
            f"The approval's `signed_at` `{approval['signed_at'][:40]}` is not an ISO-8601 "
            f"UTC time (YYYY-MM-DDTHH:MM:SSZ)."
        ) from None
    try:
        base64.b64decode(approval["signature"], validate=True)
    except (ValueError, binascii.Error):
        raise SignatureRefused("The approval's `signature` is not base64.") from None
    try:
        canonical_json(approval["policy"])
    except ValueError:
        raise SignatureRefused("The approval's `policy` holds a NaN or infinite number.") from None


def verify_approval(approval: dict, keyring: dict) -> None:
    """Raises `SignatureRefused` unless `approval` is signed by a trusted key that
    was valid when it signed, over exactly its fields.

    Cases, checked in this order:
        `key_id` not in `keyring` -> "... which is not in the trusted keyring."
            [claim:approval-key-in-keyring]
        `signed_at` outside [not_before, not_after] (both ends INCLUDED) -> "...
            (expired or not yet valid)." [claim:approval-key-window-inclusive]
        sha256 of the canonical `policy` != `policy_sha256` -> "The approval's
            `policy_sha256` does not match its policy." [claim:approval-policy-digest]
        signature does not verify over `approval_payload` -> "The approval's signature
            does not verify with key `<kid>`: ..." [claim:approval-signature-verifies]
    """
    _check_approval_fields(approval)
    # --- exercise stage 3: Trusted key, valid when it signed, and a good signature. ---
    kid = approval.get("key_id")
    entry = keyring.get(kid)
    if entry is None:
        raise SignatureRefused(
            f"The approval is signed by key `{kid}`, which is not in the trusted keyring."
        )
    signed_at = parse_iso(approval["signed_at"])
    if not parse_iso(entry["not_before"]) <= signed_at <= parse_iso(entry["not_after"]):
        raise SignatureRefused(
            f"Key `{kid}` ({entry['name']}) is valid from {entry['not_before']} to "
            f"{entry['not_after']}; the approval was signed at {approval['signed_at']} "
            f"(expired or not yet valid)."
        )
    if hashlib.sha256(canonical_json(approval["policy"])).hexdigest() != approval["policy_sha256"]:
        raise SignatureRefused("The approval's `policy_sha256` does not match its policy.")
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(entry["public_key"]))
    try:
        public.verify(base64.b64decode(approval["signature"]), approval_payload(approval))
    except InvalidSignature:
        raise SignatureRefused(
            f"The approval's signature does not verify with key `{kid}`: its fields were "
            f"changed after signing, or another key signed it."
        ) from None
    # --- end exercise ---
