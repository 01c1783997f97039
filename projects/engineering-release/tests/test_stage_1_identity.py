"""Stage 1: immutable identities.

A model's id is the digest of its artifact directory. Independent check: the
digest recomputed by coreutils (`find | sha256sum | sort | sha256sum`), not
by our code. Changed conditions: another training seed, renamed, re-timed
and re-ordered files, a flipped bit at seeded random places, a tampered
stored object.
"""

import os
import random
import shutil
import subprocess
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from engineering_release import checkpoint, data, model, store, train
from engineering_release.config import TrainConfig


def coreutils_digest(root: Path) -> str:
    """The tree digest by shell tools only: the independent reference."""
    script = (
        "( printf 'engineering-release/tree-v1\\n'; "
        "find . -type f -exec sha256sum {} + | cut -c1-64 | LC_ALL=C sort ) | sha256sum"
    )
    out = subprocess.run(["sh", "-c", script], cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


@pytest.mark.claims("model-id-is-tree-digest")
def test_same_seed_same_model_id_other_seed_other_id(trained, artifacts, tmp_path, evidence):
    """The model id equals a coreutils tree digest; seed 0 retrained gives the same id and bits,
    seed 1 another."""
    again = train.train(TrainConfig.tiny(seed=0))
    train.write_model(again, tmp_path / "again")
    ids = {
        "seed0": store.tree_digest(artifacts[0]),
        "seed0_again": store.tree_digest(tmp_path / "again"),
        "seed1": store.tree_digest(artifacts[1]),
    }
    reference = {
        "seed0": coreutils_digest(artifacts[0]),
        "seed0_again": coreutils_digest(tmp_path / "again"),
        "seed1": coreutils_digest(artifacts[1]),
    }
    assert evidence.record(
        "model id = coreutils tree digest",
        "seeds 0, 0 again, 1",
        {"ids": ids, "reference": reference},
        None,
        ids == reference,
    )
    assert evidence.record(
        "same seed, same model id",
        "two trainings of seed 0",
        {"first": ids["seed0"], "second": ids["seed0_again"]},
        None,
        ids["seed0"] == ids["seed0_again"],
    )
    assert evidence.record(
        "other seed, other model id",
        "seed 1",
        {"seed0": ids["seed0"], "seed1": ids["seed1"]},
        None,
        ids["seed0"] != ids["seed1"],
    )
    for name, value in again.params.items():  # Same bits, leaf by leaf.
        assert np.array_equal(value, trained[0].params[name]), name


@pytest.mark.claims("one-flipped-bit-changes-id", "model-id-is-tree-digest")
def test_one_flipped_bit_gives_another_id(artifacts, tmp_path, evidence):
    """A single flipped bit, at 8 seeded random places, changes the id to the coreutils digest;
    undoing it restores it."""
    rng = random.Random(1)
    original = store.tree_digest(artifacts[0])
    work = tmp_path / "flip"
    shutil.copytree(artifacts[0], work)
    files = sorted(p for p in work.iterdir() if p.is_file())
    seen = set()
    for trial in range(8):
        path = rng.choice(files)
        raw = bytearray(path.read_bytes())
        offset, bit = rng.randrange(len(raw)), rng.randrange(8)
        raw[offset] ^= 1 << bit
        path.write_bytes(bytes(raw))
        flipped, reference = store.tree_digest(work), coreutils_digest(work)
        raw[offset] ^= 1 << bit
        path.write_bytes(bytes(raw))
        restored = store.tree_digest(work)
        seen.add(flipped)
        ok = flipped != original and flipped == reference and restored == original
        assert evidence.record(
            "one flipped bit changes the id",
            f"trial {trial}: {path.name} byte {offset} bit {bit}",
            {"flipped": flipped, "coreutils": reference, "restored": restored},
            None,
            ok,
        )
    assert len(seen) == 8, "every distinct flip gives a distinct id"


@pytest.mark.claims(
    "id-ignores-names-order-timestamps",
    "digest-ignores-names-nesting-times-order",
    "files-self-describing",
)
def test_renaming_retiming_reordering_keep_the_id(artifacts, tmp_path, evidence):
    """Renamed, nested, re-timed, reverse-written files keep the id (per coreutils) and read back
    the same model."""
    original = store.tree_digest(artifacts[0])
    files = sorted(p for p in artifacts[0].iterdir() if p.is_file())
    # Files renamed, nested one level down, written in reverse order, with odd times.
    moved = tmp_path / "another-name" / "nested"
    moved.mkdir(parents=True)
    for i, path in enumerate(reversed(files)):
        target = moved / f"file-{i:02d}.bin"
        target.write_bytes(path.read_bytes())
        os.utime(target, (1_000_000 + i, 4_000_000_000 - i))
    os.utime(moved, (0, 0))
    digest = store.tree_digest(tmp_path / "another-name")
    reference = coreutils_digest(tmp_path / "another-name")
    assert evidence.record(
        "renamed, nested, re-timed, re-ordered: same id",
        f"{len(files)} files",
        {"original": original, "moved": digest, "coreutils": reference},
        None,
        digest == original == reference,
    )
    # Names carry no meaning: the renamed artifact reads back to the same model.
    renamed = checkpoint.read_artifact(tmp_path / "another-name")
    source = checkpoint.read_artifact(artifacts[0])
    assert renamed.manifest == source.manifest
    for name in source.params:
        assert np.array_equal(renamed.params[name], source.params[name]), name


@pytest.mark.claims(
    "store-write-once-atomic-rename",
    "store-refuses-tampered-objects",
    "put-same-content-writes-nothing",
    "put-keeps-tampered-evidence",
    "check-refuses-tampered-object",
)
def test_store_is_write_once_and_refuses_tampered_objects(artifacts, tmp_path, evidence):
    """A second put of the same content rewrites nothing; after one tampered byte get and put both
    refuse."""
    objects = store.Store(tmp_path / "store")
    first = objects.put(artifacts[0])
    assert first == coreutils_digest(artifacts[0])
    stored = objects.objects / first
    before = {p.name: p.stat().st_mtime_ns for p in stored.iterdir()}
    again = objects.put(artifacts[0])
    after = {p.name: p.stat().st_mtime_ns for p in stored.iterdir()}
    second = objects.put(artifacts[1])
    assert evidence.record(
        "put is idempotent and write-once",
        "same content twice, then another",
        {"ids": [first, again, second], "objects": objects.ids(), "rewritten": before != after},
        None,
        first == again and before == after and len(objects.ids()) == 2,
    )
    assert objects.get(first[:10]) == stored  # A unique prefix resolves.
    # Tamper with one byte of the stored copy: reads and re-puts are refused.
    leaf = sorted(stored.glob("*.leaf"))[0]
    leaf.chmod(0o644)
    raw = bytearray(leaf.read_bytes())
    raw[-1] ^= 0x01
    leaf.write_bytes(bytes(raw))
    with pytest.raises(store.TamperedObject, match=f"Object `{first[:12]}` is tampered"):
        objects.get(first)
    with pytest.raises(store.TamperedObject, match="tampered"):
        objects.put(artifacts[0])
    assert leaf.read_bytes() == bytes(raw), "the tampered copy is kept as evidence"
    objects.get(second)  # Other objects are unaffected.
    with pytest.raises(store.StoreError, match="Unknown object id `deadbeef00`"):
        objects.get("deadbeef00")
    evidence.record(
        "tampered object refused on read and on put",
        "last byte of a leaf",
        {"object": first},
        None,
        True,
    )


@pytest.mark.claims("store-write-once-atomic-rename")
def test_put_crash_leaves_no_partial_object(artifacts, tmp_path, evidence):
    """A put that dies after copying into scratch leaves no object: it appears
    only through the final rename."""
    objects = store.Store(tmp_path / "store")
    partial = objects.scratch / "interrupted"
    shutil.copytree(artifacts[1], partial)
    (sorted(partial.iterdir())[0]).unlink()  # Died half-way through the copy.
    assert objects.ids() == []
    swept = objects.sweep_scratch()
    object_id = objects.put(artifacts[1])
    ok = swept == 1 and objects.ids() == [object_id] and not any(objects.scratch.iterdir())
    assert evidence.record(
        "scratch is never an object",
        "interrupted copy, then a put",
        {"swept": swept, "ids": objects.ids()},
        None,
        ok,
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_stored_model_computes_what_numpy_computes(artifacts, tmp_path, seed, evidence):
    """A model read back from the store gives logits within 1e-4 of a float64 NumPy forward pass,
    for seeds 0 and 1."""
    objects = store.Store(tmp_path / "store")
    loaded = checkpoint.load_model(objects.get(objects.put(artifacts[seed])))
    heldout = data.heldout_set(0, 0.2)
    logits = np.asarray(train.predict(loaded.graphdef, loaded.params, jnp.asarray(heldout.images)))
    reference = model.forward_numpy(loaded.artifact.params, heldout.images)
    assert evidence.allclose(
        "stored model logits vs NumPy float64",
        f"seed {seed}, {len(heldout.ids)} held-out rows",
        logits,
        reference,
        rtol=1e-4,
        atol=1e-4,
    )
    golden = loaded.artifact
    golden_logits = train.predict(loaded.graphdef, loaded.params, jnp.asarray(golden.golden_inputs))
    assert np.array_equal(np.asarray(golden_logits), golden.golden_logits), (
        "the golden logits shipped with the model are its own, bit for bit"
    )


@pytest.mark.claims("put-files-read-only")
def test_stored_files_are_read_only(artifacts, tmp_path):
    """Every file of a stored object has mode 0o444 (read-only), read back with os.stat."""
    objects = store.Store(tmp_path / "store")
    stored = objects.objects / objects.put(artifacts[0])
    modes = {p.name: p.stat().st_mode & 0o777 for p in stored.rglob("*") if p.is_file()}
    assert modes and set(modes.values()) == {0o444}, modes


@pytest.mark.claims("put-files-read-only")
def test_nested_stored_files_are_read_only_at_every_depth(artifacts, tmp_path):
    """A stored directory with files two levels down: every file, at every depth, has mode
    0o444 (read-only), read back with os.stat."""
    source = tmp_path / "nested-source"
    shutil.copytree(artifacts[0], source / "a" / "b")
    (source / "top.bin").write_bytes(b"top")
    (source / "a" / "middle.bin").write_bytes(b"middle")
    objects = store.Store(tmp_path / "store")
    stored = objects.objects / objects.put(source)
    modes = {str(p.relative_to(stored)): p.stat().st_mode & 0o777 for p in stored.rglob("*")}
    files = {name: mode for name, mode in modes.items() if (stored / name).is_file()}
    depths = {name.count("/") for name in files}
    assert depths == {0, 1, 2}, sorted(files)
    assert set(files.values()) == {0o444}, files


@pytest.mark.claims("put-fsync-before-rename")
def test_every_stored_file_is_fsynced_before_the_publishing_rename(tmp_path, monkeypatch):
    """Each file of a stored object, at every depth, is fsynced before the rename that
    publishes the object: `os.fsync`, `os.rename` and `os.replace` are spied on, each
    fsync recorded by the (device, inode) of its descriptor, which the rename keeps, so
    every stored file is matched to its fsync by `os.stat` on the published object."""
    source = tmp_path / "source"
    (source / "a" / "b").mkdir(parents=True)
    for relative, content in {
        "top.bin": b"top",
        "a/middle.bin": b"middle",
        "a/b/deep.bin": b"deep",
        "a/b/other.bin": b"other",
    }.items():
        (source / relative).write_bytes(content)
    objects = store.Store(tmp_path / "store")
    events: list[tuple] = []
    real = {name: getattr(os, name) for name in ("fsync", "rename", "replace")}

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", (st.st_dev, st.st_ino)))
        return real["fsync"](fd)

    def mover(name):
        def move(src, dst, *args, **kwargs):
            events.append((name, Path(dst)))
            return real[name](src, dst, *args, **kwargs)

        return move

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", mover("rename"))
    monkeypatch.setattr(os, "replace", mover("replace"))
    object_id = objects.put(source)
    monkeypatch.undo()
    published = objects.objects / object_id
    moves = [i for i, e in enumerate(events) if e[0] != "fsync" and e[1] == published]
    assert len(moves) == 1, events  # One rename publishes the object.
    order = {}
    for path in sorted(p for p in published.rglob("*") if p.is_file()):
        st = os.stat(path)
        synced = [i for i, e in enumerate(events) if e == ("fsync", (st.st_dev, st.st_ino))]
        order[str(path.relative_to(published))] = synced
    assert len(order) == 4, order
    assert all(synced and synced[0] < moves[0] for synced in order.values()), (order, moves)


@pytest.mark.claims("model-id-is-tree-digest")
def test_a_file_of_several_chunks_hashes_as_coreutils_does(tmp_path):
    """A file longer than the 1 MiB a read takes, whose first two MiB repeat one block: the
    tree digest equals coreutils', so every chunk counts, once each and in order."""
    block = bytes(range(256)) * 4096  # 1 MiB
    root = tmp_path / "big"
    root.mkdir()
    (root / "weights.leaf").write_bytes(block + block + b"tail")
    (root / "swapped.leaf").write_bytes(b"tail" + block + block)
    assert store.tree_digest(root) == coreutils_digest(root)


@pytest.mark.claims("store-refuses-tampered-objects", "check-refuses-tampered-object")
def test_every_tampered_object_is_refused_whichever_way_its_digest_sorts(artifacts, tmp_path):
    """One byte changed at each of at least 8 places of a stored object: `get` refuses every
    one. The premise, from coreutils: the tampered digests fall on both sides of the id.

    Which side a tampered digest falls on depends on the object's bytes (a model trained
    on another backend has other bytes), so places are tried, 1/64 of the leaf apart,
    until both sides are seen: 8 places miss a side once in 128 objects, 64 places once
    in 2^63."""
    objects = store.Store(tmp_path / "store")
    object_id = objects.put(artifacts[0])
    leaf = sorted((objects.objects / object_id).glob("*.leaf"))[0]
    leaf.chmod(0o644)
    original = leaf.read_bytes()
    sides = set()
    for i in range(64):
        if i >= 8 and sides == {True, False}:
            break
        changed = bytearray(original)
        changed[i * len(original) // 64] ^= 0x01
        leaf.write_bytes(bytes(changed))
        now = coreutils_digest(objects.objects / object_id)
        sides.add(now < object_id)
        with pytest.raises(store.TamperedObject):
            objects.get(object_id)
    leaf.write_bytes(original)
    assert objects.get(object_id) == objects.objects / object_id
    assert sides == {True, False}, "the premise needs tampered digests on both sides of the id"


@pytest.mark.claims("check-tampered-message")
def test_tampered_message_names_both_digests(artifacts, tmp_path):
    """The TamperedObject message names the id and the digest coreutils computes for the tampered
    files, word for word."""
    objects = store.Store(tmp_path / "store")
    object_id = objects.put(artifacts[0])
    leaf = sorted((objects.objects / object_id).glob("*.leaf"))[0]
    leaf.chmod(0o644)
    leaf.write_bytes(leaf.read_bytes() + b"\0")
    now = coreutils_digest(objects.objects / object_id)
    with pytest.raises(store.TamperedObject) as info:
        objects.get(object_id)
    assert str(info.value) == (
        f"Object `{object_id[:12]}` is tampered: its files now hash to `{now[:12]}`. "
        "It is refused; restore it from a trusted copy."
    )


def test_ids_and_prefixes_resolve_at_their_boundaries(artifacts, tmp_path):
    """resolve accepts full ids and unique prefixes of 8 or more digits, and refuses all other text.

    A full id (64 hex digits) or a unique prefix of 8 or more resolves; 7
    digits, 65, a non-hex digit, an unknown or an ambiguous prefix are refused."""
    objects = store.Store(tmp_path / "store")
    object_id = objects.put(artifacts[0])
    for n in (8, 9, 63, 64):
        assert objects.resolve(object_id[:n]) == object_id, n
        assert objects.resolve(object_id[:n].upper() + "  ") == object_id, n
    for text in (object_id[:7], object_id + "0", "g" + object_id[1:12]):
        with pytest.raises(store.StoreError, match="is not an object id"):
            objects.resolve(text)
    with pytest.raises(store.StoreError, match="Unknown object id"):
        objects.resolve(("0" if object_id[0] != "0" else "1") * 12)
    for tail in ("0", "1"):  # two stored names sharing their first 8 digits
        (objects.objects / ("abcdef01" + tail * 56)).mkdir()
    with pytest.raises(store.StoreError, match="The prefix `abcdef01` matches 2 objects"):
        objects.resolve("abcdef01")
    assert objects.resolve("abcdef011") == "abcdef01" + "1" * 56


@pytest.mark.claims("digest-refuses-links-and-special-files")
@pytest.mark.parametrize("kind", ["symlink-file", "symlink-dir", "fifo"])
def test_links_and_special_files_are_refused(artifacts, tmp_path, kind):
    """tree_digest refuses a symlinked file, a symlinked directory and a FIFO, naming the offending
    path."""
    work = tmp_path / "work"
    shutil.copytree(artifacts[0], work)
    (work / "sub").mkdir()
    odd = work / "sub" / "odd"
    if kind == "symlink-file":
        odd.symlink_to(sorted(work.glob("*.leaf"))[0])
    elif kind == "symlink-dir":
        odd.symlink_to(work / "sub", target_is_directory=True)
    else:
        os.mkfifo(odd)
    with pytest.raises(store.StoreError, match=r"`.*sub/odd` is a link or a special file"):
        store.tree_digest(work)


@pytest.mark.claims("put-refuses-changed-copy")
def test_a_source_changed_during_the_copy_is_not_stored(artifacts, tmp_path, monkeypatch):
    """A source that changes while it is copied stores nothing and leaves no scratch copy.

    The copy's digest must be the id it is published under; a source edited
    while it was copied (simulated: the copy gains a byte) stores nothing.
    Appended bytes are tried until the changed copy's digest has sorted both
    below and above the original (which bytes do that depends on the trained
    artifact's bits, so on the CPU; 64 tries miss one side with chance 2^-63)."""
    objects = store.Store(tmp_path / "store")
    original = coreutils_digest(artifacts[0])
    real_copytree = shutil.copytree
    orders = set()
    for extra in range(64):
        if orders == {True, False}:
            break

        def copy_then_change(src, dst, symlinks=False, extra=extra):
            real_copytree(src, dst, symlinks=symlinks)
            leaf = sorted(Path(dst).glob("*.leaf"))[0]
            leaf.write_bytes(leaf.read_bytes() + bytes([extra]))
            orders.add(coreutils_digest(Path(dst)) < original)

        monkeypatch.setattr(store.shutil, "copytree", copy_then_change)
        with pytest.raises(store.StoreError, match="changed while it was copied; nothing stored"):
            objects.put(artifacts[0])
        assert objects.ids() == [] and list(objects.scratch.iterdir()) == []
    assert orders == {True, False}  # the changed copy's digest sorted both below and above


@pytest.mark.claims("put-accepts-lost-rename-race", "put-reraises-rename-error")
def test_a_concurrent_put_of_the_same_object_is_accepted(artifacts, tmp_path, monkeypatch):
    """A put that loses the rename race to an identical object succeeds; other rename errors raise.

    Another writer publishes the same id between the check and the rename:
    the rename fails, the scratch copy is dropped, the published object is kept."""
    objects = store.Store(tmp_path / "store")
    object_id = coreutils_digest(artifacts[0])
    real_rename = os.rename

    def raced(src, dst):
        if Path(dst) == objects.objects / object_id and not Path(dst).exists():
            shutil.copytree(artifacts[0], dst)  # the other writer wins
        return real_rename(src, dst)

    monkeypatch.setattr(store.os, "rename", raced)
    assert objects.put(artifacts[0]) == object_id
    assert objects.ids() == [object_id] and list(objects.scratch.iterdir()) == []
    # A rename that fails with no object published is not swallowed.
    monkeypatch.setattr(
        store.os, "rename", lambda src, dst: (_ for _ in ()).throw(OSError(5, "io"))
    )
    with pytest.raises(OSError, match="io"):
        objects.put(artifacts[1])
    assert objects.ids() == [object_id] and list(objects.scratch.iterdir()) == []
