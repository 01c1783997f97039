"""One measured conversion in its own process, for `bench.py`.

    python -m weight_conversion.bench_child {eager|streaming|copy|control} SRC DST LAYERS WIDTH

Prints one JSON line: the peak resident memory *added* by the conversion
(the high-water mark after minus before, the before taken once NumPy and
safetensors are imported), the seconds it took, and `peak_from`: which
high-water mark was read. Imports nothing from JAX, so the baseline is small
and the same for every mode. `control` converts nothing: it writes to every
page of a new SRC-sized buffer, so its added peak must be about the source's
size; a reading far below that says that the instrument cannot see this
process's peak on this machine.

The high-water mark is `VmHWM` of /proc/self/status where the kernel reports
it. `getrusage(...).ru_maxrss` is not used there: on Linux it belongs to the
task and survives `exec`, so a child started by a large parent (pytest with
JAX and PyTorch loaded) inherits the parent's high-water mark and hides its
own peak; `VmHWM` belongs to the address space that `exec` creates fresh.
Where /proc/self/status has no `VmHWM` (gVisor, the sandbox of some
accelerator machines, reports only the current `VmRSS`), the child forks
once more before importing anything and the grandchild, whose task was never
the large parent, measures with `ru_maxrss` (`peak_from` says so). Setting
`WEIGHT_CONVERSION_PEAK=ru_maxrss` takes that path on any Linux machine.
"""

import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

FORCE = "WEIGHT_CONVERSION_PEAK"  # "ru_maxrss": measure as where VmHWM is missing
FORKED = "WEIGHT_CONVERSION_PEAK_FORKED"  # set in the grandchild of the ru_maxrss path


def _vm_hwm_bytes() -> int | None:
    status = Path("/proc/self/status")
    if os.environ.get(FORCE) != "ru_maxrss" and status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def peak_source() -> str:
    """`VmHWM` where the kernel reports it, else `ru_maxrss`."""
    return "VmHWM" if _vm_hwm_bytes() is not None else "ru_maxrss"


def peak_rss_bytes() -> int:
    """High-water resident set size of this process's address space."""
    hwm = _vm_hwm_bytes()
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _fork_clean_measurer(argv: list[str]) -> None:
    """Runs this module again in a forked grandchild (a fresh task, whose `ru_maxrss`
    starts from this small process, not from the parent that started us) and exits
    with its status; its JSON line goes to the same stdout."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        env = dict(os.environ, **{FORKED: "1"})
        os.execve(
            sys.executable, [sys.executable, "-m", "weight_conversion.bench_child", *argv], env
        )
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    mode, src, dst, layers, width = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    if _vm_hwm_bytes() is None and not os.environ.get(FORKED) and hasattr(os, "fork"):
        _fork_clean_measurer(argv)
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
    elif mode == "control":
        import numpy as np

        buffer = np.ones(Path(src).stat().st_size // 8)  # every page written
        del buffer
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
                "peak_from": peak_source(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
