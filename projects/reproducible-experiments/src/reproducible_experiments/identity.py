"""Code and runtime identity: what produced a number, as flat string tags.

Code identity (`code.*`):
  - `code.git_commit`: `git rev-parse HEAD` of the repository holding this
    package (`unavailable` outside git);
  - `code.git_dirty` and `code.git_diff_sha256`: whether the package source or
    `pyproject.toml` differ from that commit, and a hash of the difference
    (`git diff HEAD --binary` plus every untracked file, path and bytes);
  - `code.source_sha256`: a hash of the package's `.py` files, which needs no
    git at all.
The scope is this project's package and `pyproject.toml`, not the whole
repository: an edit elsewhere in a monorepo does not change what ran here.

Runtime identity (`runtime.*`): Python, JAX, jaxlib, Flax, optax and NumPy
versions, backend, device kind and count, `XLA_FLAGS`, CPU architecture.
Bitwise reproduction is only promised when all of these match.
"""

import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from subprocess import TimeoutExpired

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_DIR = PACKAGE_DIR.parents[1]
CODE_SCOPE = ("src/reproducible_experiments", "pyproject.toml")
RUNTIME_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")

UNAVAILABLE = "unavailable"


def _git(*args: str, cwd: Path = PROJECT_DIR) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, timeout=30, check=False
    )


def source_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over the package's `.py` files: relative path and bytes, in path order
    [claim:source-hash-by-path-and-bytes]."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def code_identity() -> dict[str, str]:
    """The `code.*` tags of a run started from this source tree (computed once
    per process: the code a process runs is the code it loaded)."""
    return dict(_code_identity())


@functools.cache
def _code_identity() -> dict[str, str]:
    return git_identity(PROJECT_DIR, PACKAGE_DIR)


def git_identity(project_dir: Path, package_dir: Path) -> dict[str, str]:
    """The `code.*` tags of the project in `project_dir` (package in `package_dir`).

    Cases (the scope: `CODE_SCOPE` under `project_dir`):
      clean tree -> `code.git_dirty` "false", `code.git_diff_sha256` = sha256 of b""
        [claim:code-clean-tree].
      tracked edits only -> "true", and the hash is sha256 of exactly the bytes of
        `git diff HEAD --binary -- <scope>` (nothing added when no file is untracked)
        [claim:code-tracked-edits-hashed].
      untracked files -> "true"; each one's path and bytes enter the hash, so the
        same name with other bytes gives another hash [claim:code-untracked-files-hashed];
        `.pyc` files and anything under `__pycache__` are not code and never count
        [claim:code-compiled-files-never-count].
      the edits reverted -> the tags of the clean tree again [claim:code-edits-reverted].
      `code.git_commit` -> `git rev-parse HEAD`'s output, stripped [claim:code-git-commit].
      git missing or hung, or either `rev-parse` failing (no repository, no commit, no
        work tree) -> the three `code.git_*` tags "unavailable", `code.source_sha256`
        still given [claim:code-git-unavailable].
    """
    identity = {
        "code.source_sha256": source_sha256(package_dir),
        "code.git_commit": UNAVAILABLE,
        "code.git_dirty": UNAVAILABLE,
        "code.git_diff_sha256": UNAVAILABLE,
    }
    try:
        head = _git("rev-parse", "HEAD", cwd=project_dir)
        top = _git("rev-parse", "--show-toplevel", cwd=project_dir)
    except (OSError, TimeoutExpired):
        return identity
    if head.returncode != 0 or top.returncode != 0:
        return identity
    scope = [str(project_dir / part) for part in CODE_SCOPE]
    # --- exercise stage 1: Hash git diff HEAD plus untracked files; dirty if either. ---
    diff = _git("diff", "HEAD", "--binary", "--", *scope, cwd=project_dir).stdout
    untracked = _git(
        "ls-files", "--others", "--exclude-standard", "-z", "--", *scope, cwd=project_dir
    ).stdout
    digest = hashlib.sha256(diff)
    names = sorted(
        name
        for name in untracked.decode().split("\0")
        if name and "__pycache__" not in name and not name.endswith(".pyc")
    )
    for name in names:
        digest.update(b"\0untracked\0" + name.encode() + b"\0")
        digest.update((project_dir / name).read_bytes())
    identity["code.git_commit"] = head.stdout.decode().strip()
    identity["code.git_dirty"] = "true" if diff or names else "false"
    identity["code.git_diff_sha256"] = digest.hexdigest()
    # --- end exercise ---
    return identity


def runtime_identity() -> dict[str, str]:
    """The `runtime.*` tags of this process (imports JAX to ask for its devices)
    [claim:runtime-identity-tags]."""
    import jax

    devices = jax.devices()
    identity = {"runtime.python": platform.python_version()}
    for name in RUNTIME_PACKAGES:
        identity[f"runtime.{name}"] = importlib.metadata.version(name)
    identity.update(
        {
            "runtime.backend": jax.default_backend(),
            "runtime.device_kind": devices[0].device_kind,
            "runtime.device_count": str(len(devices)),
            "runtime.xla_flags": os.environ.get("XLA_FLAGS", ""),
            "runtime.machine": platform.machine(),
        }
    )
    return identity


def differences(recorded: dict[str, str], current: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Keys whose values differ (a key missing on one side counts): `{key: (recorded, now)}`
    [claim:identity-differences-key-by-key]."""
    keys = sorted(set(recorded) | set(current))
    return {
        key: (recorded.get(key, "<missing>"), current.get(key, "<missing>"))
        for key in keys
        if recorded.get(key) != current.get(key)
    }
