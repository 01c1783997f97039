"""One measured conversion in its own process, for `bench.py`.

    python -m weight_conversion.bench_child {eager|streaming|copy} SRC DST LAYERS WIDTH

Prints one JSON line: the peak resident memory *added* by the conversion
(`VmHWM` of /proc/self/status after minus before, the before taken once
NumPy and safetensors are imported) and the seconds it took. Imports nothing
from JAX, so the baseline is small and the same for every mode.

Why `VmHWM` and not `getrusage(...).ru_maxrss`: on Linux `ru_maxrss` belongs
to the task and survives `exec`, so a child started by a large parent
inherits the parent's high-water mark and hides its own peak; `VmHWM`
belongs to the address space that `exec` creates fresh.
"""

import json
import resource
import shutil
import sys
import time
from pathlib import Path


def peak_rss_bytes() -> int:
    """High-water resident set size of this process's address space."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: best effort


def main(argv: list[str]) -> None:
    mode, src, dst, layers, width = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    from weight_conversion import streaming, synthetic

    rules, spec = synthetic.linear_stack(layers, width)
    before = peak_rss_bytes()
    start = time.perf_counter()
    if mode == "eager":
        streaming.convert_file_eager(src, dst, rules, synthetic.ARCH, spec)
    elif mode == "streaming":
        streaming.convert_file(src, dst, rules, synthetic.ARCH, spec)
    elif mode == "copy":
        shutil.copyfile(src, dst)
    else:
        raise SystemExit(f"unknown mode `{mode}`")
    seconds = time.perf_counter() - start
    after = peak_rss_bytes()
    print(
        json.dumps(
            {
                "mode": mode,
                "seconds": seconds,
                "added_bytes": after - before,
                "baseline_bytes": before,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
