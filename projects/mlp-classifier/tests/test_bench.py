"""`mlp-classifier bench`: the report keeps its format and the four paths do the
same work. No speed is asserted here (a test may run a benchmark
on a tiny size to check that it still works, never to assert a speed)."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from mlp_classifier import bench, bench_paths
from mlp_classifier.config import Config

JAX_PATHS = ("nnx_jit", "split_jit", "scan", "scan_aa")
IDENTITY_KEYS = ("jax", "jaxlib", "flax", "backend", "devices", "xla_flags", "commit")
MEASUREMENT_KEYS = ("compile_s", "first_call_s", "median_s", "p90_s", "n")


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The tiny bench, run once through the CLI; yields `(report, out_path, result)`."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(bench.bench, ["--size", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), out, result


def test_report_has_the_benchmarks_format(report):
    data, _out, _result = report
    assert {"identity", "measurements", "ratios"} <= data.keys()
    identity = data["identity"]
    for key in IDENTITY_KEYS:
        assert key in identity, key
    assert identity["devices"] >= 1
    assert len(identity["config_sha256"]) == 64
    int(identity["config_sha256"], 16)


def test_every_path_is_measured_with_finite_positive_times(report):
    data, _out, _result = report
    paths = [*JAX_PATHS]
    if _torch_available():
        paths.append("torch")
    else:
        assert "torch is not importable" in data["torch_skipped"]
    expected = {f"{s}/{p}" for s in ("small", "large") for p in paths}
    expected |= {"small/train_step", "large/gemm_ceiling"}
    expected |= {f"large/{p}" for p in bench.LIMIT_PATHS}
    expected.add("large/scan_partitionable_bits")
    assert set(data["measurements"]) == expected
    for name, m in data["measurements"].items():
        for key in MEASUREMENT_KEYS:
            assert key in m, (name, key)
        assert m["n"] == data["repeats"] == len(m["times_s"]), name
        for key in ("first_call_s", "median_s", "p90_s"):
            assert math.isfinite(m[key]) and m[key] > 0, (name, key, m[key])
        assert math.isfinite(m["compile_s"]) and m["compile_s"] >= 0, name
        assert m["p90_s"] >= m["median_s"], name
    for name, value in data["ratios"].items():
        assert math.isfinite(value) and value > 0, (name, value)
    assert "large/scan_vs_gemm_ceiling" in data["ratios"]
    for setting in ("small", "large"):
        for pair in (
            "scan_vs_per_step",
            "scan_vs_nnx_jit",
            "split_jit_vs_nnx_jit",
            "scan_vs_scan_aa",
        ):
            assert f"{setting}/{pair}" in data["ratios"]


def test_every_ratio_names_its_baseline_aa_and_spread(report):
    """`ratio_details`: one entry per ratio with a baseline sentence, the
    setting's A/A control and the per-round ratios, recomputed here from the
    recorded times (the per-step baseline is the split_jit loop)."""
    data, _out, _result = report
    details = data["ratio_details"]
    assert set(details) == set(data["ratios"])
    for name, d in details.items():
        setting = name.split("/", 1)[0]
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        assert d["aa"] == data["ratios"][f"{setting}/scan_vs_scan_aa"], name
        assert len(d["rounds"]) == data["repeats"], name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["min"] == min(d["rounds"]) and d["max"] == max(d["rounds"]), name
    m = data["measurements"]
    for setting in ("small", "large"):
        d = details[f"{setting}/scan_vs_per_step"]
        assert d["baseline"].startswith("split_jit")
        want = [
            b / a
            for a, b in zip(
                m[f"{setting}/scan"]["times_s"], m[f"{setting}/split_jit"]["times_s"], strict=True
            )
        ]
        assert d["rounds"] == pytest.approx(want, rel=1e-12)
        ratio = m[f"{setting}/split_jit"]["median_s"] / m[f"{setting}/scan"]["median_s"]
        assert data["ratios"][f"{setting}/scan_vs_per_step"] == pytest.approx(ratio, rel=1e-12)
    assert details["small/scan_vs_nnx_jit"]["baseline"].startswith("nnx_jit")


def test_loops_never_recompile(report):
    """Each JAX path compiles once, ahead of time (`scan_aa` reuses `scan`'s
    executable), and the first and timed calls reuse that executable: no
    compile and no retrace after `prepare`."""
    data, _out, _result = report
    for name, m in data["measurements"].items():
        if name.endswith("/torch"):
            continue
        assert m["compiles"]["prepare"] == (0 if name.endswith("/scan_aa") else 1), name
        assert m["compiles"]["first_call"] == 0, name
        assert m["compiles"]["timed"] == 0, name
        assert m["traces"]["first_call"] == 0, name
        assert m["traces"]["timed"] == 0, name


def test_jax_paths_agree_in_the_report(report):
    data, _out, _result = report
    checks = data["checks"]
    for setting in ("small", "large"):
        paths = ("split_jit", "scan", "scan_aa", "train_step")[: 4 if setting == "small" else 3]
        for path in paths:
            assert checks[f"{setting}/{path}_vs_nnx_jit_max_abs_loss_diff"] <= 1e-6


def test_plot_and_table_are_written(report):
    _data, out, result = report
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "small/scan_vs_per_step" in result.stdout
    assert "small/scan_vs_nnx_jit" in result.stdout
    assert "[small]" in result.stderr  # Progress goes to stderr.


def _tiny_setting(dropout_rate: float, optimizer: str) -> bench.Setting:
    extra = {"weight_decay": 0.0, "learning_rate": 0.05} if optimizer == "sgd" else {}
    config = Config(
        **{
            **Config.default().model_dump(),
            "hidden_sizes": (16,),
            "dropout_rate": dropout_rate,
            "optimizer": optimizer,
            **extra,
        }
    )
    return bench.Setting("small", config, "digits", 64, num_steps=5)


def _train(path, epochs: int = 2) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    losses = []
    for _ in range(epochs):
        path.run_epoch()
        losses.append(path.losses())
    return np.concatenate(losses), path.params()


def test_jax_paths_compute_the_same_training():
    """(a) nnx.jit loop, (b) split + jit loop, (c) scan and the project's own
    `train.train_step`, from one init on the same batches, with dropout on:
    identical losses and weights up to
    float32 rounding (observed bitwise equal; the tolerance leaves XLA room
    to fuse the scan body differently). Equal dropout masks show the RNG
    state is threaded through the pure paths like the in-place one."""
    setting = _tiny_setting(dropout_rate=0.2, optimizer="adamw")
    batches = bench.make_batches(setting)
    ref_losses, ref_params = _train(bench.NnxJitPath("nnx_jit", setting, batches))
    for path in (
        bench.SplitJitPath("split_jit", setting, batches),
        bench.ScanPath("scan", setting, batches),
        bench.TrainStepPath("train_step", setting, batches),
    ):
        losses, params = _train(path)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-6, atol=1e-7, err_msg=path.name)
        assert params.keys() == ref_params.keys()
        for key in ref_params:
            np.testing.assert_allclose(
                params[key], ref_params[key], rtol=1e-6, atol=1e-7, err_msg=f"{path.name} {key}"
            )


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_torch_follows_the_jax_trajectory_without_dropout(optimizer):
    """With dropout 0 (torch draws its own masks otherwise), torch from the
    copied init follows the scan path's losses and weights. Tolerance 1e-5
    absolute and relative: two frameworks' float32 GEMMs and reductions round
    differently (observed differences <= 5e-7 over 10 steps)."""
    bench_torch = pytest.importorskip("mlp_classifier.bench_torch")
    setting = _tiny_setting(dropout_rate=0.0, optimizer=optimizer)
    batches = bench.make_batches(setting)
    ref_losses, ref_params = _train(bench.ScanPath("scan", setting, batches))
    model, _optimizer = bench.init_train_state(setting)
    losses, params = _train(bench_torch.TorchPath(model, setting.config, batches, seed=0))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    assert params.keys() == ref_params.keys()
    for key in ref_params:
        np.testing.assert_allclose(params[key], ref_params[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_unknown_size_is_refused():
    result = CliRunner().invoke(bench.bench, ["--size", "huge"])
    assert result.exit_code != 0
    assert "huge" in result.output


def test_large_setting_runs_with_original_threefry_bits(report):
    """The large setting is a bench-only choice: `threefry_partitionable` False
    for its paths, JAX's default kept for one named comparison path."""
    data, _out, _result = report
    assert data["settings"]["large"]["threefry_partitionable"] is False
    assert data["settings"]["small"]["threefry_partitionable"] is None
    d = data["ratio_details"]["large/scan_vs_scan_partitionable_bits"]
    assert "threefry_partitionable(True)" in d["baseline"]
    assert "large/scan_partitionable_bits_vs_gemm_ceiling" in data["ratios"]


def test_large_setting_reports_its_limits(report):
    """The bounds of the large setting: each has a `*_vs_gemm_ceiling` ratio
    with details, and the per-step cost split adds up to the step."""
    data, _out, _result = report
    for path in ("scan", *bench.LIMIT_PATHS):
        name = f"large/{path}_vs_gemm_ceiling"
        assert name in data["ratios"], name
        assert "gemm_ceiling" in data["ratio_details"][name]["baseline"]
    costs = data["flops"]["large"]["limits_ms_per_step"]
    parts = costs["dropout"] + costs["adamw_over_sgd"] + costs["other_non_matmul"]
    assert parts + costs["matmuls"] == pytest.approx(costs["step"], rel=1e-9)
    m = data["measurements"]
    steps = data["flops"]["large"]["steps_per_epoch"]
    assert costs["matmuls"] == pytest.approx(m["large/matmul_floor"]["median_s"] * 1e3 / steps)


def test_matmul_flops_counts_forward_and_backward_products():
    """Widths (4, 3, 2), batch 5: kernels 4x3 and 3x2 cost 2*5*4*3 = 120 and
    2*5*3*2 = 60 FLOPs a product; each appears forward and in its weight
    gradient, and the second also in its input gradient: 2 * 180 + 60."""
    assert bench_paths.matmul_flops([4, 3, 2], 5) == 420.0


def test_matmul_floor_keeps_every_product():
    """XLA may not simplify the floor's products away: its executable's FLOPs
    (one scan body) are at least the products' count for one step."""
    setting = bench.bench_size("tiny").large
    batches = bench.make_batches(setting)
    path = bench_paths.MatmulFloorPath("matmul_floor", setting, batches)
    path.prepare()
    widths = [setting.in_features, *setting.config.hidden_sizes, 10]
    assert path.cost["flops"] >= bench_paths.matmul_flops(widths, setting.config.batch_size)
    before = [np.array(k) for k in path.kernels]  # Copies: the kernels are donated.
    path.run_epoch()
    after = [np.asarray(k) for k in path.kernels]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
