"""Bayesian linear regression with a conjugate Normal-Inverse-Gamma prior: the
exact posterior, hand-built HMC and VI judged against it, and sampler
diagnostics (R-hat, ESS, simulation-based calibration) checked against ArviZ
and NumPyro."""

__version__ = "0.1.0"
