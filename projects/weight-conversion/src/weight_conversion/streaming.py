"""Conversion from a safetensors file to a safetensors file, tensor by tensor.

`convert_file` never holds the whole source, and never memory-maps it: it reads
the source header (names, dtypes, shapes, byte ranges) with plain reads and
checks it (`safetensors_header.read_header`: the documented format, validated
as the safetensors library validates it), checks the names against the map,
writes the output header (whose shapes come from the target model), then for
each rule reads only that rule's tensors (positioned reads of their byte
ranges), transforms them, appends the result and lets them go. (`safe_open`
maps the whole file, and under gVisor a mapping counts whole in the peak
resident memory even when only the names are read: see `safetensors_header`.)

safetensors offers no incremental writer (`save_file` takes a complete
dict), so the output is written here in the documented format: an 8-byte
little-endian header length, the JSON header (padded with spaces to a
multiple of 8), then each tensor's bytes at its `data_offsets`. The tests
read every file back with the safetensors library itself.

Errors (a damaged header, a name the map does not know, a truncated file, an
unsupported dtype, a wrong shape, a NaN or infinite value) raise `MappingError`
naming the tensor; the output is written to a temporary name and renamed only when
complete, and folders made for it are removed again, so nothing is left behind.

`convert_file_eager` is the baseline: `load_file` everything, convert, and
`save_file` the result.
"""

import contextlib
import json
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from weight_conversion.config import Arch
from weight_conversion.safetensors_header import (  # describe_damage: used by the loaders
    Header,
    HeaderDamage,
    describe_damage,
    read_header,
)
from weight_conversion.weight_map import MappingError, Rule, apply_rule, check_names, convert

DTYPE_CODES = {
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
}

# The safetensors dtype codes NumPy can hold (as `safe_open(..., framework="numpy")`
# reads them; bfloat16 and the float8 types are not among them), little-endian.
_NUMPY_DTYPES = {
    code: np.dtype(name).newbyteorder("<")
    for code, name in {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "U16": "uint16",
        "I16": "int16",
        "U32": "uint32",
        "I32": "int32",
        "U64": "uint64",
        "I64": "int64",
        "F16": "float16",
        "F32": "float32",
        "F64": "float64",
    }.items()
}

Spec = Mapping[str, tuple[tuple[int, ...], np.dtype]]


def _source_header(path: Path) -> Header:
    """The source's header, read and checked without mapping the file; `MappingError`
    names what is damaged."""
    try:
        return read_header(path)
    except HeaderDamage as damage:
        raise MappingError([f"cannot open `{path}`: {damage}"]) from None


def _read(path: Path, header: Header, names: list[str]) -> dict[str, np.ndarray]:
    """Only `names`, each read from its byte range of `path` into a new array.

    Positioned reads, never a memory map: a sandbox that maps files differently
    (gVisor, on some accelerator machines) counts a whole mapped source in the peak
    resident memory of the process (see `safetensors_header`). `header` is the one
    `_source_header` read and checked (ranges within the file, sizes = shape x dtype)."""
    try:
        out = {}
        with path.open("rb", buffering=0) as f:
            for name in names:
                entry = header.tensors.get(name)
                if entry is None:
                    continue
                dtype = _NUMPY_DTYPES.get(entry.dtype)
                if dtype is None:
                    raise TypeError(
                        f"dtype {entry.dtype} of `{name}` is not one of {', '.join(_NUMPY_DTYPES)}"
                    )
                array = np.empty(entry.shape, dtype)
                if array.nbytes:  # (a view of a zero-size array cannot be cast to bytes)
                    view, done = memoryview(array).cast("B"), 0
                    f.seek(header.data_start + entry.begin)
                    while done < array.nbytes:
                        got = f.readinto(view[done:])
                        if not got:
                            raise ValueError(f"`{name}` is cut off")
                        done += got
                out[name] = array
            return out
    except (OSError, TypeError, ValueError) as err:
        damage = describe_damage(path)
        raise MappingError(
            [f"cannot read source tensor(s) {names} from `{path}`: {damage or err}"]
        ) from None


def output_header(spec: Spec, order: list[str], metadata: dict[str, str] | None) -> bytes:
    """The safetensors header for tensors written in `order` with `spec`'s shapes."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        shape, dtype = spec[name]
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": DTYPE_CODES[np.dtype(dtype)],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def convert_file(
    src: str | Path,
    dst: str | Path,
    rules: list[Rule],
    arch: Arch,
    spec: Spec,
    metadata: dict[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Streams `src` (a source-framework safetensors file) through `rules` into
    `dst` (an NNX safetensors file). Peak memory: about one rule's tensors.

    The header (written first) lists the targets rule by rule, each rule's in
    `rule.targets` order [claim:stream-header-order]; the data must follow in exactly
    that order, each array's raw bytes (`tobytes()`) as `apply_rule` returns it.
    [claim:stream-data-order] Read a rule's
    sources with `_read` only when the rule runs, and drop them before the next.
    [claim:stream-one-rule-at-a-time]
    `progress(done, total)` is called after each rule, `done` from 1 to `len(rules)`.
    [claim:stream-progress]
    """
    src, dst = Path(src), Path(dst)
    header = _source_header(src)
    keys = sorted(header.tensors)  # in the order safetensors lists them
    problems = check_names(rules, keys, spec.keys())
    if problems:
        raise MappingError(problems)
    order = [path for rule in rules for path in rule.targets]
    created = [p for p in (dst.parent, *dst.parent.parents) if not p.exists()]
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + f".partial-{os.getpid()}")
    done_ok = False
    try:
        with tmp.open("wb") as out:
            out.write(output_header(spec, order, metadata))
            # --- exercise stage 3: Per rule: read its tensors lazily, convert, write the bytes. ---
            for done, rule in enumerate(rules, start=1):
                arrays = _read(src, header, list(rule.sources))
                converted = apply_rule(rule, arrays, arch, spec)
                del arrays
                for path in rule.targets:  # the order of the header's offsets
                    out.write(converted[path].tobytes())
                del converted
                if progress:
                    progress(done, len(rules))
            # --- end exercise ---
        os.replace(tmp, dst)
        done_ok = True
    finally:
        tmp.unlink(missing_ok=True)
        if not done_ok:  # a refused source leaves no folder behind either
            for folder in created:  # deepest first; only the empty ones made here
                with contextlib.suppress(OSError):
                    folder.rmdir()
    return dst


def convert_file_eager(
    src: str | Path,
    dst: str | Path,
    rules: list[Rule],
    arch: Arch,
    spec: Spec,
    metadata: dict[str, str] | None = None,
) -> Path:
    """The baseline: the whole source in memory, converted, saved in one call."""
    src, dst = Path(src), Path(dst)
    try:
        source = load_file(str(src))
    except (SafetensorError, OSError) as err:
        raise MappingError([f"cannot open `{src}`: {describe_damage(src) or err}"]) from None
    arrays = convert(rules, source, arch, spec)
    tmp = dst.with_name(dst.name + f".partial-{os.getpid()}")
    try:
        save_file(arrays, str(tmp), metadata=metadata)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst
