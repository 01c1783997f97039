"""A write-once, content-addressed store of directories.

An object's id is `tree_digest` of its directory: the sha256 of a canonical
serialization that depends on the bytes of its files and nothing else (not
their names, order on disk, timestamps or permissions). The files here are
self-describing (see `checkpoint`), so the names carry no meaning to lose.

The digest, in shell terms (the tests compute it this way as a reference):

    ( printf 'engineering-release/tree-v1\\n';
      find DIR -type f -exec sha256sum {} + | cut -c1-64 | LC_ALL=C sort ) | sha256sum

Write-once: `put` copies into a scratch directory, checks the copy's digest,
and renames it to `objects/<id>` in one atomic step, so an object is either
absent or complete, and a crash leaves only scratch to sweep. An id that is
present is never written again. `get` recomputes the digest on every read:
a tampered object is refused, never served.
"""

import hashlib
import os
import shutil
import uuid
from pathlib import Path

from engineering_release.config import shown

TREE_FORMAT = b"engineering-release/tree-v1\n"
ID_LENGTH = 64
HEX = "0123456789abcdef"
CHUNK_BYTES = 1 << 20  # A file's bytes are read this many at a time (any size hashes alike).


class StoreError(ValueError):
    """A request the store refuses (unknown id, bad input); the message says why."""


class TamperedObject(StoreError):
    """A stored object whose bytes no longer hash to its id."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(root: str | Path) -> str:
    """The content id of the directory `root` (see the module docstring).

    Refuses symbolic links and special files: their meaning lies outside the bytes.

    Cases:
        a symlink (to a file or a directory) or a FIFO anywhere below `root`
            -> `StoreError`: "`<path>` is a link or a special file; only plain files."
            [claim:digest-refuses-links-and-special-files]
        file names, nesting, timestamps, order on disk -> no effect on the digest
            [claim:digest-ignores-names-nesting-times-order]
    """
    root = Path(root)
    if not root.is_dir():
        raise StoreError(f"`{root}` is not a directory.")
    # --- exercise stage 1: Hash each file's bytes, then hash the sorted digests. ---
    digests = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise StoreError(f"`{path}` is a link or a special file; only plain files.")
        for name in filenames:
            digests.append(file_sha256(Path(dirpath) / name))
    h = hashlib.sha256(TREE_FORMAT)
    for digest in sorted(digests):
        h.update(digest.encode("ascii") + b"\n")
    return h.hexdigest()
    # --- end exercise ---


class Store:
    """Objects live in `root/objects/<id>/`; scratch copies in `root/scratch/`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.scratch = self.root / "scratch"

    def put(self, source: str | Path) -> str:
        """Stores a copy of the directory `source`; returns its id.

        Storing the same content again returns the same id and writes nothing
        [claim:put-same-content-writes-nothing].
        If the stored copy no longer matches its id, raises `TamperedObject`
        instead of replacing it: the evidence is kept for whoever investigates
        [claim:put-keeps-tampered-evidence].

        Cases:
            published object -> every file mode 0o444 (read-only) [claim:put-files-read-only],
                fsynced before the rename [claim:put-fsync-before-rename]
            the copy's digest differs from the source's -> scratch copy removed,
                `StoreError`: "`<source>` changed while it was copied; nothing stored."
                [claim:put-refuses-changed-copy]
            the rename fails but another writer published the same id -> its id, scratch removed
                [claim:put-accepts-lost-rename-race]
            the rename fails and no object was published -> the `OSError` is re-raised
                [claim:put-reraises-rename-error]
        """
        source = Path(source)
        # --- exercise stage 1: Copy, check, publish by one rename; never rewrite an id. ---
        object_id = tree_digest(source)
        target = self.objects / object_id
        if target.exists():
            self._check(object_id)
            return object_id
        self.objects.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        tmp = self.scratch / f"{object_id}.{uuid.uuid4().hex}"
        shutil.copytree(source, tmp, symlinks=True)
        copied = tree_digest(tmp)
        if copied != object_id:
            shutil.rmtree(tmp)
            raise StoreError(f"`{source}` changed while it was copied; nothing stored.")
        for dirpath, _, filenames in os.walk(tmp):
            for name in filenames:
                path = Path(dirpath) / name
                with path.open("rb") as f:
                    os.fsync(f.fileno())
                path.chmod(0o444)
            _fsync_dir(Path(dirpath))  # The names of its files, durable before the rename.
        try:
            os.rename(tmp, target)  # Atomic: the object appears complete or not at all.
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not target.exists():
                raise
        _fsync_dir(self.objects)
        self._check(object_id)
        return object_id
        # --- end exercise ---

    def get(self, object_id: str) -> Path:
        """The directory of `object_id`, after checking its bytes still hash to it."""
        if not self.has(object_id):
            object_id = self.resolve(object_id)
        self._check(object_id)
        return self.objects / object_id

    def _check(self, object_id: str) -> None:
        """Raises `TamperedObject` unless the object's files still hash to `object_id`
        [claim:check-refuses-tampered-object].

        The message, word for word (12-digit prefixes of the id and of the new digest):
        "Object `<id>` is tampered: its files now hash to `<digest>`. It is refused;
        restore it from a trusted copy." [claim:check-tampered-message]
        """
        # --- exercise stage 1: Recompute the object's digest; refuse it if it is not the id. ---
        actual = tree_digest(self.objects / object_id)
        if actual != object_id:
            raise TamperedObject(
                f"Object `{object_id[:12]}` is tampered: its files now hash to "
                f"`{actual[:12]}`. It is refused; restore it from a trusted copy."
            )
        # --- end exercise ---

    def has(self, object_id: str) -> bool:
        return (
            len(object_id) == ID_LENGTH
            and all(c in HEX for c in object_id)
            and (self.objects / object_id).is_dir()
        )

    def ids(self) -> list[str]:
        if not self.objects.is_dir():
            return []
        return sorted(p.name for p in self.objects.iterdir() if p.is_dir())

    def resolve(self, object_id: str) -> str:
        """A full id from an id or a unique prefix of at least 8 hex digits."""
        text = object_id.strip().lower()
        if len(text) < 8 or len(text) > ID_LENGTH or any(c not in HEX for c in text):
            raise StoreError(
                f"`{shown(object_id)}` is not an object id (64 hex digits, or a unique prefix "
                f"of >= 8)."
            )
        matches = [i for i in self.ids() if i.startswith(text)]
        match matches:
            case [only]:
                return only
            case []:
                raise StoreError(
                    f"Unknown object id `{shown(object_id)}`: the store holds no such object."
                )
            case _:
                raise StoreError(
                    f"The prefix `{shown(object_id)}` matches {len(matches)} objects; give more."
                )

    def discard(self, object_id: str) -> None:
        """Removes the object `object_id` that a failed command stored and nothing
        references (never an object in use: the caller stored it moments ago, under
        the state's lock). One rename takes it out of `objects/`; then it is deleted."""
        target = self.objects / object_id
        if not self.has(object_id):
            return
        self.scratch.mkdir(parents=True, exist_ok=True)
        doomed = self.scratch / f"{object_id}.discarded.{uuid.uuid4().hex}"
        os.rename(target, doomed)
        _fsync_dir(self.objects)
        shutil.rmtree(doomed, ignore_errors=True)

    def sweep_scratch(self) -> int:
        """Removes scratch copies a crashed `put` left behind; returns how many."""
        if not self.scratch.is_dir():
            return 0
        leftovers = list(self.scratch.iterdir())
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        return len(leftovers)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
