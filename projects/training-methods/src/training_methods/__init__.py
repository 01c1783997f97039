"""Objective labs on a small Flax NNX Transformer."""
