"""A candidate server runs in a process of its own (`serve.Backend` and
`engineering_release.candidate`): it answers with its model's predictions, it
reports a failed load as `failed`, and its process ends when the host stops it
or when the host's end of its standard input closes (the host died)."""

import os
import time
from pathlib import Path

import httpx

from engineering_release import checkpoint, data, model
from engineering_release.serve import Backend

HANG_GUARD_S = 300.0  # Only stops a hung test; no duration is asserted.


def settle(backend: Backend) -> str:
    deadline = time.monotonic() + HANG_GUARD_S
    while backend.status == "loading" and time.monotonic() < deadline:
        time.sleep(0.05)
    return backend.status


def test_candidate_serves_its_model_from_another_process_and_stops(evaluated_store):
    store, models, _ = evaluated_store
    backend = Backend(store.root, models[1])
    backend.start()
    try:
        assert settle(backend) == "ready", backend.reason
        assert backend.proc.pid != os.getpid()
        rows = data.heldout_set(0, 0.2).images[:8]
        with httpx.Client(base_url=f"http://127.0.0.1:{backend.port}", timeout=30.0) as http:
            ready = http.get("/readyz")
            answer = http.post("/predict", json={"inputs": rows.tolist()})
            refused = http.post("/predict", json={"inputs": [[1.0] * 3]})
        assert ready.status_code == 200 and ready.json()["self_test"]["passed"] is True
        startup = ready.json()["startup"]
        parts = (
            "cpu_s_web_server",
            "cpu_s_jax_and_model_imports",
            "cpu_s_jax_client",
            "cpu_s_load_selftest_compile",
        )
        assert all(startup[k] >= 0 for k in parts)
        assert abs(sum(startup[k] for k in parts) - startup["cpu_s_total"]) < 1e-6
        assert answer.status_code == 200 and answer.json()["model_id"] == models[1]
        # The same answers as the NumPy float64 forward pass of the stored parameters.
        params = checkpoint.read_artifact(store.get(models[1])).params
        expected = model.forward_numpy(params, rows).argmax(axis=1)
        assert answer.json()["predictions"] == expected.tolist()
        assert refused.status_code == 422
    finally:
        backend.stop()
    assert backend.proc.returncode is not None
    assert backend.status == "ready"  # A stop asked for is not a failure.


def test_unknown_model_is_failed_and_the_process_ends_with_its_host(evaluated_store):
    store, _, _ = evaluated_store
    backend = Backend(store.root, "f" * 64)
    backend.start()
    try:
        assert settle(backend) == "failed"
        assert "StoreError" in backend.reason
        with httpx.Client(base_url=f"http://127.0.0.1:{backend.port}", timeout=30.0) as http:
            body = http.get("/readyz")
        assert body.status_code == 503 and body.json()["status"] == "failed"
        # The host's end of standard input closes (as when the host's process dies):
        # the candidate's process ends, and the host sees it as failed with the reason.
        backend.proc.stdin.close()
        code = backend.proc.wait(HANG_GUARD_S)
        deadline = time.monotonic() + HANG_GUARD_S
        while "exited" not in backend.reason and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backend.status == "failed" and f"code {code}" in backend.reason
    finally:
        backend.stop()


def thread_nices(pid: int) -> dict[int, tuple[str, int]]:
    """Name and nice value of each thread of `pid`, read from /proc by the test itself."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = ((task / "comm").read_text().strip(), int(fields[16]))
    return out


def test_start_up_at_a_lower_priority_leaves_no_serving_thread_lowered(evaluated_store):
    """With `load_nice`, the start-up threads ran lowered and ended: once ready, every
    thread left (those that serve) is at the process's own nice value."""
    store, models, _ = evaluated_store
    backend = Backend(store.root, models[0], load_nice=7)
    backend.start()
    try:
        assert settle(backend) == "ready", backend.reason
        with httpx.Client(base_url=f"http://127.0.0.1:{backend.port}", timeout=30.0) as http:
            startup = http.get("/readyz").json()["startup"]
            answer = http.post("/predict", json={"inputs": [[0.0] * 64]})
        nices = thread_nices(backend.proc.pid)
        own = os.getpriority(os.PRIO_PROCESS, 0)  # The candidate inherits the host's.
        lowered = {name for name, nice in nices.values() if nice != own}
        assert startup["load_nice"] == 7
        # Only LLVM's compile workers (started by the lowered compile) stay lowered;
        # the event loop (the main thread) and XLA's execution threads do not.
        assert all(name.startswith("llvm-worker") for name in lowered), nices
        assert sorted(lowered) == sorted(set(startup["threads_left_lowered"]))
        assert nices[backend.proc.pid] == ("python", own)
        assert all(n == own for name, n in nices.values() if "XLAEigen" in name), nices
        assert answer.status_code == 200 and answer.json()["model_id"] == models[0]
    finally:
        backend.stop()
