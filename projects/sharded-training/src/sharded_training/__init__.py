"""Sharded training."""
