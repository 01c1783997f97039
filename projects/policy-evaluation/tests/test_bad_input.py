"""Bad input: every `policy-evaluation` command, and every library entry point a learner
calls with a file, an array or a config, refuses damaged input with one precise message.

CLI promise: exit code 2 (the project's `BadInput`, or click's own usage error), one
line naming the file, field or value, no traceback (`result.exception` is None or
`SystemExit`), and nothing written (the watched folder's file names and bytes are equal
before and after). Library promise: a `ValueError` (the project's errors subclass it)
whose message names the field or value; never a silent NaN result.

Nothing here trains: every case is refused before a program is compiled. The damage
is drawn by hypothesis (kind, field, value) or enumerated where a table is clearer; the
case count goes to `evidence/bad_input.json` at module end.
"""

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import click
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from policy_evaluation import checkpoint, envs, exact, rollout
from policy_evaluation.cli import main
from policy_evaluation.config import Config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
SOME = settings(max_examples=30, derandomize=True, deadline=None, database=None)

LEDGER: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
COVERED_COMMANDS = {"inspect", "train", "bench"}


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "cases": LEDGER["cases"],
        "tracebacks": LEDGER["tracebacks"],
        "commands": sorted(LEDGER["commands"]),
        "entry_points": sorted(LEDGER["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(record, indent=1) + "\n")


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def check_cli(args: list[str], watch: Path, token: str) -> None:
    """`policy-evaluation ARGS` must refuse with exit 2 and one line naming `token`."""
    before = _snapshot(watch)
    result = CliRunner().invoke(main, args)
    LEDGER["cases"] += 1
    LEDGER["commands"].add(args[0])
    crashed = not (result.exception is None or isinstance(result.exception, SystemExit))
    LEDGER["tracebacks"] += int(crashed or "Traceback" in result.output)
    assert not crashed, f"{args}: {type(result.exception).__name__}: {result.exception}"
    assert "Traceback" not in result.output
    assert result.exit_code == 2, (args, result.output)
    lines = [
        line
        for line in result.output.splitlines()
        if line.strip() and not line.startswith(("Usage:", "Try "))
    ]
    assert len(lines) == 1, (args, result.output)
    assert token in lines[0], (args, token, result.output)
    assert _snapshot(watch) == before, (args, "the command wrote files")


def check_api(name: str, call, token: str) -> None:
    """`call()` must raise a ValueError whose message names `token`."""
    LEDGER["cases"] += 1
    LEDGER["entry_points"].add(name)
    with pytest.raises(ValueError, match=re.escape(token)):
        call()


# --- configs: `inspect --config`, `train --config`, `Config.from_json` ------------------

BAD_FIELD_VALUES: dict[str, list[Any]] = {
    "env": ["mountaincar", 1, None],
    "seed": [-1, 2**32, 1.5, "0", True],
    "num_seeds": [0, 257, 3],  # 3: not a multiple of `seed_shards` (1 in the tiny config)
    "seed_shards": [0, 3, 300],
    "num_envs": [0, -4, 5000],
    "num_steps": [0, 5000, 1.5],
    "total_timesteps": [0, 10, 10**10],
    "update_epochs": [0, 101],
    "num_minibatches": [0, 7, 5000],
    "gamma": [0.0, 1.0, NAN, INF, -0.5],
    "gae_lambda": [-0.1, 1.5, NAN],
    "clip_eps": [0.0, 1.0, NAN],
    "ent_coef": [-0.01, NAN, INF],
    "vf_coef": [-1.0, NAN, INF],
    "learning_rate": [0.0, 2.0, NAN, INF],
    "max_grad_norm": [0.0, -1.0, NAN, INF],
    "anneal_lr": ["yes", 1, None],
    "hidden_size": [0, 5000, 32.5],
    "eval_episodes": [1, 0, 10**6],
    "eval_greedy": ["no", 0],
    "eval_horizon": [0, 10**6],
}
TINY = json.loads(Config.tiny("gridworld").to_json())


@st.composite
def damaged_config(draw) -> tuple[str, bytes | None, str]:
    """(kind, bytes to write or None, the token the message must name)."""
    kind = draw(
        st.sampled_from(
            [
                "missing",
                "directory",
                "empty",
                "truncated",
                "non_utf8",
                "not_json",
                "wrong_type",
                "unknown_field",
                "bad_value",
            ]
        )
    )
    text = json.dumps(TINY)
    if kind in ("missing", "directory"):
        return kind, None, "config.json"
    if kind == "empty":
        return kind, b"", "config.json"
    if kind == "truncated":
        return kind, text[: draw(st.integers(1, len(text) - 2))].encode(), "config.json"
    if kind == "non_utf8":
        return kind, b"\xff\xfe" + text.encode("utf-16-le"), "config.json"
    if kind == "not_json":
        return kind, b"env = gridworld\n", "config.json"
    if kind == "wrong_type":
        value = draw(st.sampled_from([[1, 2], "gridworld", 3, None]))
        return kind, json.dumps(value).encode(), "config.json"
    if kind == "unknown_field":
        name = draw(st.sampled_from(["num_env", "lr", "seeds", "Gamma"]))
        return kind, json.dumps({**TINY, name: 1}).encode(), name
    field = draw(st.sampled_from(sorted(BAD_FIELD_VALUES)))
    value = draw(st.sampled_from(BAD_FIELD_VALUES[field]))
    return kind, json.dumps({**TINY, field: value}).encode(), field


@SOME
@given(damage=damaged_config())
def test_damaged_config_is_refused_by_every_reader(damage):
    kind, content, token = damage
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "config.json"
        if kind == "directory":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        check_api("Config.from_json", lambda: Config.from_json(path), token)
        grid = ["--env", "gridworld", "--config", str(path)]
        check_cli(["inspect", *grid], root, token)
        check_cli(["train", *grid, "--workdir", str(root / "run")], root, token)


@pytest.mark.parametrize(
    ("changes", "token"),
    [
        ({"num_seeds": 4, "seed_shards": 4}, "seed_shards"),  # conftest starts 2 CPU devices
        ({"env": "cartpole"}, "--env"),  # disagrees with `--env gridworld`
    ],
)
def test_config_that_does_not_fit_this_run_is_refused_before_training(tmp_path, changes, token):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY, **changes}))
    args = ["train", "--env", "gridworld", "--config", str(config)]
    check_cli([*args, "--workdir", str(tmp_path / "run")], tmp_path, token)


@pytest.mark.parametrize(
    ("changes", "token"),
    [({"gamma": NAN}, "gamma"), ({"num_envs": 0}, "num_envs"), ({"colour": 1}, "colour")],
)
def test_replace_and_from_dict_refuse_bad_values(changes, token):
    check_api("Config.replace", lambda: Config.tiny().replace(**changes), token)
    check_api("Config.from_dict", lambda: Config.from_dict({**TINY, **changes}), token)
    check_api("Config.from_dict", lambda: Config.from_dict([1, 2]), "config")


def test_bad_cli_choices_are_refused(tmp_path):
    check_cli(["inspect", "--env", "mountaincar"], tmp_path, "mountaincar")
    check_cli(["train", "--env", "pong", "--workdir", str(tmp_path / "r")], tmp_path, "pong")
    check_cli(["bench", "--size", "huge", "--out", str(tmp_path / "b.json")], tmp_path, "huge")


# --- output paths: train --workdir, bench --out ----------------------------------------


@pytest.mark.parametrize("damage", ["is a file", "under a file"])
def test_unusable_workdir_is_refused_before_training(tmp_path, damage):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory\n")
    workdir = blocker if damage == "is a file" else blocker / "run"
    config = PROJECT_ROOT / "configs" / "gridworld_tiny.json"
    args = ["train", "--env", "gridworld", "--config", str(config), "--workdir", str(workdir)]
    check_cli(args, tmp_path, "blocker")


@pytest.mark.parametrize(
    ("out", "token"),
    [("{blocker}/bench.json", "blocker"), ("{tmp}/bench.png", "bench.png"), ("{tmp}", "--out")],
)
def test_bad_bench_out_is_refused_before_timing(tmp_path, out, token):
    (tmp_path / "blocker").write_text("a file, not a directory\n")
    out = out.format(blocker=tmp_path / "blocker", tmp=tmp_path)
    check_cli(["bench", "--size", "tiny", "--out", out], tmp_path, token)


# --- saved parameters: `checkpoint.load_params` -----------------------------------------


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> tuple[Path, dict]:
    like = {"a": np.zeros((2, 3), np.float32), "b": [np.ones(4, np.float32)]}
    path = tmp_path_factory.mktemp("params") / "params.npz"
    checkpoint.save_params(path, like)
    return path, like


def test_saved_params_load_back(params_file):
    """Positive control: the file the damage starts from loads into `like`."""
    path, like = params_file
    loaded = checkpoint.load_params(path, like)
    np.testing.assert_array_equal(loaded["a"], like["a"])
    np.testing.assert_array_equal(loaded["b"][0], like["b"][0])


@pytest.mark.parametrize(
    "damage",
    ["missing", "directory", "empty", "not_npz", "truncated", "fewer", "more", "shape", "dtype"],
)
def test_damaged_params_file_is_refused(tmp_path, params_file, damage):
    good, like = params_file
    path = tmp_path / "params.npz"
    if damage == "directory":
        path.mkdir()
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "not_npz":
        path.write_text("params\n")
    elif damage == "truncated":
        path.write_bytes(good.read_bytes()[:100])
    elif damage in ("fewer", "more", "shape", "dtype"):
        arrays = [like["a"], like["b"][0]]
        if damage == "fewer":
            arrays = arrays[:1]
        elif damage == "more":
            arrays = [*arrays, np.zeros(1, np.float32)]
        elif damage == "shape":
            arrays = [np.zeros((3, 2), np.float32), arrays[1]]
        else:
            arrays = [arrays[0].astype(np.float64), arrays[1]]
        np.savez(path, *arrays)
    check_api("checkpoint.load_params", lambda: checkpoint.load_params(path, like), "params.npz")


# --- arrays: the exact evaluator ----------------------------------------------------


@pytest.fixture(scope="module")
def mdp():
    env = envs.GridWorld()
    P, R, terminal = env.transition_table()
    return env, P, R, terminal


@st.composite
def damaged_exact_args(draw, mdp) -> tuple[str, dict[str, Any], str]:
    env, P, R, terminal = mdp
    S, A = P.shape[:2]
    args: dict[str, Any] = {
        "P": P,
        "R": R,
        "terminal": terminal,
        "pi": np.full((S, A), 1.0 / A),
        "theta": np.zeros((S, A)),
        "gamma": 0.95,
        "start": env.start,
    }
    field = draw(st.sampled_from(["P", "R", "terminal", "pi", "theta", "gamma", "start"]))
    if field == "P":
        bad = draw(
            st.sampled_from(
                [P[:, :, :-1], P[..., None], P * 2.0, np.where(P > 0, NAN, P), -P, P[:-1]]
            )
        )
    elif field == "R":
        bad = draw(st.sampled_from([R[:-1], R[..., 0], np.full_like(R, NAN), R + INF]))
    elif field == "terminal":
        bad = draw(st.sampled_from([terminal[:-1], terminal.astype(np.float64) + 0.5]))
    elif field == "pi":
        pi = args["pi"]
        bad = draw(st.sampled_from([pi[:, :-1], pi * 2.0, np.full_like(pi, NAN), -pi, pi[None]]))
    elif field == "theta":
        bad = draw(st.sampled_from([args["theta"][:, :-1], np.full((S, A), NAN)]))
    elif field == "gamma":
        bad = draw(st.sampled_from([1.0, 1.5, -0.1, NAN, INF]))
    else:
        bad = draw(st.sampled_from([-1, S, 2.5]))
    return field, {**args, field: bad}, f"`{field}`"


@pytest.mark.parametrize(
    "function", ["evaluate_policy", "value_iteration", "exact_policy_gradient"]
)
@settings(max_examples=15, derandomize=True, deadline=None, database=None)
@given(data_draw=st.data())
def test_exact_evaluator_refuses_bad_arrays(mdp, function, data_draw):
    field, a, token = data_draw.draw(damaged_exact_args(mdp), label="damage")
    uses = {
        "evaluate_policy": {"P", "R", "terminal", "pi", "gamma"},
        "value_iteration": {"P", "R", "terminal", "gamma"},
        "exact_policy_gradient": {"P", "R", "terminal", "theta", "gamma", "start"},
    }[function]
    assume(field in uses)  # Damage to an argument `function` does not take: drawn again.
    call = {
        "evaluate_policy": lambda: exact.evaluate_policy(
            a["P"], a["R"], a["terminal"], a["pi"], a["gamma"]
        ),
        "value_iteration": lambda: exact.value_iteration(a["P"], a["R"], a["terminal"], a["gamma"]),
        "exact_policy_gradient": lambda: exact.exact_policy_gradient(
            a["P"], a["R"], a["terminal"], a["theta"], a["gamma"], a["start"]
        ),
    }[function]
    check_api(f"exact.{function}", call, token)


# --- arrays: returns and advantages --------------------------------------------------


@st.composite
def damaged_returns_args(draw) -> tuple[dict[str, Any], str]:
    T, N = 5, 3
    args: dict[str, Any] = {
        "rewards": jnp.ones((T, N)),
        "values": jnp.zeros((T, N)),
        "dones": jnp.zeros((T, N), bool),
        "masks": jnp.ones((T, N)),
        "last_value": jnp.zeros(N),
        "gamma": 0.9,
        "lam": 0.95,
    }
    field = draw(st.sampled_from(sorted(args)))
    if field in ("gamma", "lam"):
        bad: Any = draw(st.sampled_from([NAN, INF, -0.5, 1.5]))
    elif field == "last_value":
        bad = draw(st.sampled_from([jnp.zeros(N + 1), jnp.zeros((N, 1)), jnp.full(N, NAN)]))
    else:
        bad = draw(
            st.sampled_from(
                [jnp.ones((T, N + 1)), jnp.ones((T + 1, N)), jnp.ones(T), jnp.full((T, N), NAN)]
            )
        )
        if field == "dones" and bad.dtype != bool and not np.isnan(np.asarray(bad)).any():
            bad = bad.astype(bool)
    return {**args, field: bad}, f"`{field}`"


@SOME
@given(damage=damaged_returns_args())
def test_returns_and_advantages_refuse_bad_arrays(damage):
    a, token = damage
    if token not in ("`values`", "`lam`"):
        check_api(
            "rollout.discounted_returns",
            lambda: rollout.discounted_returns(
                a["rewards"], a["dones"], a["masks"], a["last_value"], a["gamma"]
            ),
            token,
        )
    check_api(
        "rollout.gae",
        lambda: rollout.gae(
            a["rewards"], a["values"], a["dones"], a["masks"], a["last_value"], a["gamma"], a["lam"]
        ),
        token,
    )


# --- environments: `envs.make_env` ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "overrides", "token"),
    [
        ("mountaincar", {}, "mountaincar"),
        ("gridworld", {"slip": 1.5}, "slip"),
        ("gridworld", {"slip": NAN}, "slip"),
        ("gridworld", {"size": 1}, "size"),
        ("gridworld", {"goal": 16}, "goal"),
        ("gridworld", {"pit": -1}, "pit"),
        ("gridworld", {"start": 15}, "start"),  # the goal: an episode that ends at once
        ("gridworld", {"max_steps": 0}, "max_steps"),
        ("gridworld", {"step_reward": INF}, "step_reward"),
        ("gridworld", {"colour": 1}, "colour"),
        ("cartpole", {"tau": 0.0}, "tau"),
        ("cartpole", {"masspole": -0.1}, "masspole"),
        ("cartpole", {"max_steps": -5}, "max_steps"),
        ("cartpole", {"gravity": NAN}, "gravity"),
    ],
)
def test_make_env_refuses_bad_parameters(name, overrides, token):
    check_api("envs.make_env", lambda: envs.make_env(name, **overrides), token)


def test_undamaged_arrays_are_accepted(mdp):
    """Positive control: the arguments every damage above starts from are accepted."""
    env, P, R, terminal = mdp
    pi = np.full(P.shape[:2], 0.25)
    V = exact.evaluate_policy(P, R, terminal, pi, 0.95)
    assert np.isfinite(V).all() and V[env.goal] == 0.0
    ones = jnp.ones((5, 3))
    G = rollout.discounted_returns(ones, jnp.zeros((5, 3), bool), ones, jnp.zeros(3), 0.9)
    assert float(G[-1, 0]) == 1.0 and float(G[0, 0]) == pytest.approx(sum(0.9**k for k in range(5)))
    assert envs.make_env("gridworld", slip=0.0).slip == 0.0


# --- coverage ----------------------------------------------------------------------


def _command_names(group: click.Group, prefix: str = "") -> set[str]:
    names = set()
    for name, command in group.commands.items():
        names.add(prefix + name)
        if isinstance(command, click.Group):
            names |= _command_names(command, f"{prefix}{name} ")
    return names


def test_every_command_has_bad_input_cases(request):
    """Read from the click group itself: a new command without cases fails here. When
    every test of this module was selected, what actually ran must cover them too."""
    assert _command_names(main) == COVERED_COMMANDS
    ran = {item.originalname for item in request.session.items if item.path == Path(__file__)}
    if ran >= {name for name in globals() if name.startswith("test_")}:
        assert LEDGER["commands"] == COVERED_COMMANDS
        assert LEDGER["tracebacks"] == 0 and LEDGER["cases"] > 0
