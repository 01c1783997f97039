"""Functional JAX environments, scan rollouts with masks, and PPO judged by an exact evaluator."""
