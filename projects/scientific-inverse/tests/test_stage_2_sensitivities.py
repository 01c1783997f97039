"""Stage 2: sensitivities of a trajectory loss with respect to the physical parameters.

Independent checks: reverse-mode autodiff through the RK4 scan (the discrete
derivative) against central finite differences of the same discrete loss
(NumPy loop, float64); two continuous references that share no code (autodiff
of the exact oscillator solution, and the forward sensitivity equations with
hand-written Jacobians integrated by SciPy); the discrete derivative
converging to the continuous one at order 4 as the step shrinks; diffrax's
RecursiveCheckpointAdjoint and BacksolveAdjoint against each other and the
reference. Repeated for two steps, two systems and two solver tolerances.
"""

import numpy as np
import pytest

from scientific_inverse import sensitivity as S
from scientific_inverse.model import PENDULUM

PROBLEM = S.oscillator_problem()
ARGS = tuple(PROBLEM[k] for k in ("system", "theta", "y0", "ts", "data"))
# Central differences in float64 at h = 1e-5 |theta|: truncation ~h^2 and
# round-off ~eps / h both below 1e-8 of the gradient's scale.
FD_RTOL = 1e-7


def pendulum_problem() -> tuple:
    ts = 0.1 * np.arange(1, 31, dtype=np.float64)
    y0 = np.array([1.2, 0.0])
    data = np.cos(2.0 * ts)  # any data: the gradient only needs to be far from zero
    return PENDULUM, np.array([1.0, 0.2]), y0, ts, data


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("dt", [0.05, 0.0125])
@pytest.mark.parametrize("system", ["oscillator", "pendulum"])
def test_discrete_derivative_equals_finite_differences(system, dt, evidence):
    args = ARGS if system == "oscillator" else pendulum_problem()
    autodiff = S.discrete_grad(*args, dt)
    fd = S.finite_difference_grad(*args, dt)
    rel = _rel(autodiff, fd)
    assert evidence.record(
        "autodiff through scan vs central FD",
        f"{system}, dt {dt}",
        {"autodiff": autodiff, "finite_difference": fd, "max_rel": rel},
        {"rtol": FD_RTOL},
        rel <= FD_RTOL,
    ), rel


def test_two_continuous_references_agree(evidence):
    exact = S.exact_grad(*ARGS[1:])
    forward = S.forward_sensitivity_grad(*ARGS)
    assert evidence.allclose(
        "exact-solution gradient vs forward sensitivity (SciPy)",
        "oscillator (m, c, k)",
        forward,
        exact,
        rtol=1e-8,
        atol=1e-12,
    )


@pytest.mark.parametrize("system", ["oscillator", "pendulum"])
def test_discrete_derivative_converges_to_continuous_at_order_four(system, evidence):
    args = ARGS if system == "oscillator" else pendulum_problem()
    reference = (
        S.exact_grad(*args[1:]) if system == "oscillator" else S.forward_sensitivity_grad(*args)
    )
    # The pendulum's larger error constant needs smaller steps to reach the asymptotic range.
    dts = (0.1, 0.05, 0.025, 0.0125) if system == "oscillator" else (0.05, 0.025, 0.0125, 0.00625)
    gaps = [_rel(S.discrete_grad(*args, dt), reference) for dt in dts]
    order = float(np.polyfit(np.log(dts), np.log(gaps), 1)[0])
    observed = {"dt": dts, "rel_gap_to_continuous": gaps, "observed_order": order}
    passed = abs(order - 4.0) <= 0.4 and all(
        a > b for a, b in zip(gaps[:-1], gaps[1:], strict=True)
    )
    assert evidence.record(
        "discrete -> continuous derivative",
        system,
        observed,
        {"order": 4.0, "abs": 0.4, "monotone": True},
        passed,
    ), observed


@pytest.mark.parametrize("rtol", [1e-7, 1e-10])
def test_diffrax_adjoints_agree_with_each_other_and_the_reference(rtol, evidence):
    """Tolerance: 100 rtol relative to the gradient's scale for each adjoint against
    the exact gradient and against each other (observed: 1 to 10 rtol). The
    tolerance is a traced value, so the second condition reuses the executables."""
    exact = S.exact_grad(*ARGS[1:])
    recursive = S.diffrax_grad(*ARGS, adjoint="recursive", rtol=rtol)
    backsolve = S.diffrax_grad(*ARGS, adjoint="backsolve", rtol=rtol)
    observed = {
        "recursive_vs_exact": _rel(recursive, exact),
        "backsolve_vs_exact": _rel(backsolve, exact),
        "recursive_vs_backsolve": _rel(recursive, backsolve),
    }
    bound = 100 * rtol
    assert evidence.record(
        "diffrax Tsit5 + PID: RecursiveCheckpoint vs Backsolve vs exact",
        f"rtol = atol = {rtol:g}",
        observed,
        {"rel": bound},
        all(v <= bound for v in observed.values()),
    ), observed


@pytest.mark.parametrize("rtol", [1e-4, 1e-6])
def test_recursive_is_the_discrete_derivative_and_backsolve_is_not(rtol, evidence):
    """Discretise-then-optimise vs optimise-then-discretise, told apart by what each
    differentiates. Forward-mode differentiation of the solver's own steps
    (`diffrax.ForwardMode`, `jacfwd`) is the exact derivative of the computed
    trajectory. `RecursiveCheckpointAdjoint` reverses those same steps, so it must
    equal it to float64 round-off (1e-12). `BacksolveAdjoint` solves the continuous
    adjoint ODE backwards with its own steps, so it must differ from it by an amount
    of the order of the tolerance (at least 1e-2 rtol; observed about 0.3-0.4 rtol),
    while still agreeing with the exact gradient (the test above)."""
    forward = S.diffrax_grad(*ARGS, adjoint="forward", rtol=rtol)
    recursive = S.diffrax_grad(*ARGS, adjoint="recursive", rtol=rtol)
    backsolve = S.diffrax_grad(*ARGS, adjoint="backsolve", rtol=rtol)
    observed = {
        "recursive_vs_forward_mode": _rel(recursive, forward),
        "backsolve_vs_forward_mode": _rel(backsolve, forward),
    }
    assert evidence.record(
        "diffrax adjoints vs forward mode through the same steps",
        f"rtol = atol = {rtol:g}",
        observed,
        {"recursive_at_most": 1e-12, "backsolve_at_least": 1e-2 * rtol},
        observed["recursive_vs_forward_mode"] <= 1e-12
        and observed["backsolve_vs_forward_mode"] >= 1e-2 * rtol,
    ), observed


def test_non_grid_observation_times_are_refused():
    with pytest.raises(ValueError, match=r"`dt = 0.03` cannot reach the end time"):
        S.discrete_grad(*ARGS, 0.03)
