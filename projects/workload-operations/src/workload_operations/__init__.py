"""A supervised JAX training job: observed, failed on purpose, continued from an accepted step."""
