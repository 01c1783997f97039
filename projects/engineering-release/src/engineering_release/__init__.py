"""Releases bound to immutable model and evaluation identities."""
