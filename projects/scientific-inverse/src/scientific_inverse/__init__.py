"""Scientific inverse problem: batched ODE simulation with `lax.scan`, checked
sensitivities (autodiff, finite differences, forward sensitivity equations,
diffrax adjoints) and a damped oscillator's parameters recovered from noisy
observations with their error budget (parameter error, prediction error,
solver bias), identifiability and interval coverage."""

__version__ = "0.1.0"
