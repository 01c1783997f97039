"""The MLflow Model Registry as a view of the release log.

One registered model (`digits-classifier`); one model version per content
id (tag `model_id`, source the store object); tags `evaluation_id` on a
version once evaluated. The aliases `champion` (serving) and `previous` (what
served before it) and the registered model's tags `ledger.length` and
`ledger.head` are derived from the log by `sync`, never set on their own;
`check` compares them with the log. The log is the record: an alias that
disagrees with it is an error, and `sync` moves the aliases to the log.

The anchor (`ledger.length`, `ledger.head`) also guards the log's tail: a
log shorter than the anchor, or whose entry at the anchor's length does not
hash to the anchor's head, lost or changed committed entries.

The store is named explicitly (`sqlite:///...`): MLflow otherwise falls back
to `./mlruns` or `MLFLOW_TRACKING_URI`, silently.
"""

from pathlib import Path

from engineering_release import ledger

MODEL_NAME = "digits-classifier"
CHAMPION, PREVIOUS = "champion", "previous"


class RegistryError(ValueError):
    """A registry that does not agree with the log, or a request it refuses."""


def connect(db_path: str | Path):
    """A client bound to the SQLite file `db_path` (created on first use)."""
    import logging

    from mlflow import MlflowClient

    # MLflow announces creating and migrating a new database on INFO, on every new state.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    db_path = Path(db_path).resolve()
    db_path.parent.mkdir(parents=True, exist_ok=True)
    if db_path.is_file() and db_path.stat().st_size == 0:
        # SQLite would take an empty file for a new database and start a registry
        # that has forgotten every version: refused, so a person decides.
        raise RegistryError(
            f"The registry `{db_path}` is an empty file, not a registry database "
            f"(delete it to start a new, empty registry)."
        )
    uri = f"sqlite:///{db_path}"
    try:
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        _ensure_model(client)
        state(client)
    except (SQLAlchemyError, MlflowException) as err:
        cause = getattr(err, "orig", None) or err
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise RegistryError(f"The registry `{db_path}` cannot be used: {reason[:200]}.") from None
    return client


def _ensure_model(client) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(MODEL_NAME)
    except MlflowException:
        client.create_registered_model(
            MODEL_NAME, description="Digits classifier releases, named by content id."
        )


def version_of(client, model_id: str) -> str | None:
    """The version number registered for `model_id`, or None."""
    found = client.search_model_versions(f"name='{MODEL_NAME}' and tags.model_id='{model_id}'")
    return min((v.version for v in found), key=int) if found else None


def register(client, model_id: str, source: str) -> str:
    """The version of `model_id`, registered now if it is new (idempotent)."""
    existing = version_of(client, model_id)
    if existing is not None:
        return existing
    version = client.create_model_version(
        MODEL_NAME, source=source, tags={"model_id": model_id}, description=f"model {model_id}"
    )
    return version.version


def tag_evaluation(client, model_id: str, evaluation_id: str) -> None:
    version = version_of(client, model_id)
    if version is None:
        raise RegistryError(f"Model `{model_id[:12]}` is not registered.")
    client.set_model_version_tag(MODEL_NAME, version, "evaluation_id", evaluation_id)


def _alias_model(client, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(MODEL_NAME, alias)
    except MlflowException:
        return None
    return version.tags.get("model_id")


def state(client) -> dict:
    """What the registry says: the aliases' model ids and the log anchor."""
    tags = client.get_registered_model(MODEL_NAME).tags
    length = tags.get("ledger.length", "0")
    if not (length.isascii() and length.isdigit()):
        raise RegistryError(
            f"The registry's anchor `ledger.length` is `{length[:20]}`, not a count."
        )
    return {
        CHAMPION: _alias_model(client, CHAMPION),
        PREVIOUS: _alias_model(client, PREVIOUS),
        "ledger.length": int(length),
        "ledger.head": tags.get("ledger.head", ledger.GENESIS),
    }


def expected(entries: list[dict]) -> dict:
    """What the registry must say for the log `entries`."""
    return {
        CHAMPION: ledger.serving_model(entries),
        PREVIOUS: ledger.previous_model(entries),
        "ledger.length": len(entries),
        "ledger.head": entries[-1]["hash"] if entries else ledger.GENESIS,
    }


def check(client, entries: list[dict]) -> list[str]:
    """Every way the registry disagrees with the log `entries`; empty when they agree.

    Cases, in this order (values shown as 12-character prefixes):
        anchored length > log length -> "The registry anchored <n> log entries, but the
            log holds <m>: committed entries were deleted." (no head check then)
            [claim:registry-check-deleted-entries]
        else, entry `length - 1` does not hash to `ledger.head` -> "Log entry <k> does
            not hash to the registry's anchor `<head>`: a committed entry was changed."
            [claim:registry-check-changed-entry]
        then for `champion`, `previous`, `ledger.length`, `ledger.head`, each that differs
            from `expected(entries)` -> "The registry's `<key>` is `<actual>`, the log
            says `<wanted>`." [claim:registry-check-stale-keys]
    A registry that only lags (a shorter anchor that matches) reports stale keys only
    [claim:registry-check-lag-is-stale-only].
    """
    problems = []
    # --- exercise stage 3: Compare aliases and anchor with the log; report lost entries. ---
    actual, wanted = state(client), expected(entries)
    length = actual["ledger.length"]
    if length > len(entries):
        problems.append(
            f"The registry anchored {length} log entries, but the log holds {len(entries)}: "
            f"committed entries were deleted."
        )
    elif length and entries[length - 1]["hash"] != actual["ledger.head"]:
        problems.append(
            f"Log entry {length - 1} does not hash to the registry's anchor "
            f"`{actual['ledger.head'][:12]}`: a committed entry was changed."
        )
    for key in (CHAMPION, PREVIOUS, "ledger.length", "ledger.head"):
        if actual[key] != wanted[key]:
            problems.append(
                f"The registry's `{key}` is `{str(actual[key])[:12]}`, the log says "
                f"`{str(wanted[key])[:12]}`."
            )
    # --- end exercise ---
    return problems


def sync(client, entries: list[dict], crashpoint=lambda name: None) -> None:
    """Moves the aliases and the anchor to what the log says (idempotent).

    Refuses when the log is SHORTER than the anchor, or when its entry at the
    anchor's length is not the anchored head: that is lost or rewritten history,
    not lag, and only a person can decide what happened.
    """
    actual, wanted = state(client), expected(entries)
    length = actual["ledger.length"]
    if length > len(entries):
        raise RegistryError(
            f"The registry anchored {length} log entries, but the log holds "
            f"{len(entries)}; refusing to move aliases backwards over lost entries."
        )
    if length and entries[length - 1]["hash"] != actual["ledger.head"]:
        raise RegistryError(
            f"Log entry {length - 1} does not hash to the registry's anchor "
            f"`{actual['ledger.head'][:12]}`: the log is not an extension of the anchored "
            f"one; refusing to move the anchor over a changed entry."
        )
    for alias in (PREVIOUS, CHAMPION):
        model_id = wanted[alias]
        if model_id is None:
            if actual[alias] is not None:
                client.delete_registered_model_alias(MODEL_NAME, alias)
            continue
        version = version_of(client, model_id)
        if version is None:
            raise RegistryError(f"The log names model `{model_id[:12]}`, which is not registered.")
        if actual[alias] != model_id:
            client.set_registered_model_alias(MODEL_NAME, alias, version)
        crashpoint(f"alias-{alias}")
    client.set_registered_model_tag(MODEL_NAME, "ledger.length", str(wanted["ledger.length"]))
    client.set_registered_model_tag(MODEL_NAME, "ledger.head", wanted["ledger.head"])
