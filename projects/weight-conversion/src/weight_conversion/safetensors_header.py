"""The header of a safetensors file, read and checked with plain reads (no memory map).

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
unsigned length N, then N bytes of UTF-8 JSON, then the data section. The JSON
object maps each tensor's name to `{"dtype", "shape", "data_offsets": [begin,
end]}`, the offsets in bytes from the start of the data section (the byte after
the header), `end` exclusive; an optional `"__metadata__"` maps strings to
strings.

`read_header` checks what the safetensors library's own reader checks before it
hands out a tensor: N within the file (and within safetensors' limit of 10^8
bytes), the JSON an object, each entry well-formed with a dtype safetensors
defines, each byte range inside the data section and exactly prod(shape) x the
dtype's size long, the ranges not overlapping and covering the data section with
no gap and nothing after the last, so the file is exactly 8 + N + the data's
length. A file that fails raises `HeaderDamage`, whose message names the first
problem (the tensor, where there is one); `describe_damage` returns that message.

Why not `safe_open`: it memory-maps the whole file. On Linux a handle that only
lists the names touches a few pages, but under gVisor (the sandbox of some
accelerator machines) merely opening a 25 MB file with `safe_open` and listing
its keys added 25.8 MB to the peak resident memory (`ru_maxrss`) of a fresh
process, while positioned reads of 1 MB chunks added 1.1 MB: a streaming
conversion that validated its source with `safe_open` held the whole source
after all. The streaming path (`streaming.convert_file`) therefore reads the
header here and each tensor's bytes with positioned reads; the loaders that
read every tensor anyway keep `safe_open`.
"""

import dataclasses
import json
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000  # safetensors refuses a longer header ("header too large")
_USIZE = 2**64  # safetensors reads offsets and shapes as 64-bit unsigned integers

# Bits per value of every dtype code safetensors 0.8 defines.
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}


class HeaderDamage(ValueError):
    """A file that is not a well-formed safetensors file; the message says where."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of the header: `begin`, `end` count from the start of the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclasses.dataclass(frozen=True)
class Header:
    length: int  # N: the JSON's length in bytes
    tensors: dict[str, Entry]  # in the order the header lists them
    metadata: dict[str, str] | None

    @property
    def data_start(self) -> int:
        """The file offset of the data section's first byte."""
        return 8 + self.length


def _is_count(x: object) -> bool:
    """A JSON integer a u64 can hold (not a bool, not a float)."""
    return type(x) is int and 0 <= x < _USIZE


def _refuse_constant(name: str) -> None:
    raise ValueError(f"`{name}` is not JSON")  # NaN, Infinity: Python's json would accept them


def _read_json(path: Path) -> tuple[dict, int, int]:
    """The header's JSON object, N and the data section's size (file size - 8 - N)."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise HeaderDamage("the file is empty")
        with path.open("rb", buffering=0) as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise HeaderDamage(
                    f"the header claims {length} bytes but the file has {size - 8} after it"
                )
            if length > MAX_HEADER_BYTES:
                raise HeaderDamage(
                    f"the header claims {length} bytes, more than safetensors' limit of "
                    f"{MAX_HEADER_BYTES}"
                )
            text = b""
            while len(text) < length:
                chunk = f.read(length - len(text))
                if not chunk:
                    raise HeaderDamage(f"the header is cut off after {len(text)} bytes")
                text += chunk
        header = json.loads(text.decode("utf-8"), parse_constant=_refuse_constant)
    except (OSError, struct.error, ValueError, RecursionError) as err:  # JSON, UTF-8: ValueError
        if isinstance(err, HeaderDamage):
            raise
        raise HeaderDamage(f"the header cannot be read ({err})") from None
    if not isinstance(header, dict):
        raise HeaderDamage(
            f"the header is a JSON {type(header).__name__}, not an object of tensors"
        )
    return header, length, size - 8 - length


def read_header(path: str | Path) -> Header:
    """The header of the safetensors file `path`, every check above passed; else
    `HeaderDamage` naming the first problem. Reads the first 8 + N bytes only."""
    raw, length, data_size = _read_json(Path(path))
    metadata = raw.get("__metadata__")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise HeaderDamage("the header's `__metadata__` is not an object of strings")
    entries = {name: e for name, e in raw.items() if name != "__metadata__"}
    # First the byte ranges against the file: a truncated file names its first cut-off tensor.
    for name, entry in entries.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
            raise HeaderDamage(f"tensor `{name}` has no valid `data_offsets` in the header")
        begin, end = offsets
        if end > data_size:
            raise HeaderDamage(
                f"tensor `{name}` needs bytes {begin}..{end} of the data section, but the "
                f"file holds only {data_size} (truncated)"
            )
    tensors = {}
    for name, entry in entries.items():
        dtype, shape = entry.get("dtype"), entry.get("shape")
        begin, end = entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise HeaderDamage(
                f"tensor `{name}` has dtype {json.dumps(dtype)}, not one safetensors defines "
                f"({', '.join(DTYPE_BITS)})"
            )
        if not isinstance(shape, list) or not all(map(_is_count, shape)):
            raise HeaderDamage(f"tensor `{name}` has no valid `shape` in the header")
        if end < begin:
            raise HeaderDamage(
                f"tensor `{name}` has data_offsets [{begin}, {end}]: its end before its begin"
            )
        count = 1
        for dim in shape:  # as safetensors multiplies: every partial product a u64
            count *= dim
            if count >= _USIZE:
                raise HeaderDamage(f"tensor `{name}` has shape {shape}: too many values")
        bits = count * DTYPE_BITS[dtype]
        if bits >= _USIZE:
            raise HeaderDamage(f"tensor `{name}` has shape {shape}: too many bits of {dtype}")
        if bits % 8:
            raise HeaderDamage(
                f"tensor `{name}`: {count} values of {dtype} do not fill a whole number of bytes"
            )
        if end - begin != bits // 8:
            raise HeaderDamage(
                f"tensor `{name}` spans {end - begin} bytes (data_offsets [{begin}, {end}]), but "
                f"its shape {tuple(shape)} of {dtype} needs {bits // 8}"
            )
        tensors[name] = Entry(dtype, tuple(shape), begin, end)
    # Then the ranges against each other: contiguous from 0 to the end of the file.
    covered, previous = 0, None
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin < covered:
            raise HeaderDamage(
                f"tensor `{name}` (bytes {entry.begin}..{entry.end}) overlaps `{previous}` "
                f"(which ends at {covered})"
            )
        if entry.begin > covered:
            raise HeaderDamage(
                f"bytes {covered}..{entry.begin} of the data section belong to no tensor "
                f"(a gap before `{name}`)"
            )
        covered, previous = entry.end, name
    if covered != data_size:
        raise HeaderDamage(
            f"the data section holds {data_size} bytes but its tensors end at {covered}: "
            f"{data_size - covered} trailing bytes belong to no tensor"
        )
    return Header(length, tensors, dict(metadata) if metadata is not None else None)


def describe_damage(path: str | Path) -> str | None:
    """For a safetensors file that does not open: what is wrong with it (the first
    tensor cut off, or why the header cannot be read), or None if `read_header`
    finds nothing."""
    try:
        read_header(path)
    except HeaderDamage as damage:
        return str(damage)
    return None
