"""Deployment audit: a trained artifact, an exported model that refuses the wrong input,
precision policies, and a server measured under a stated load."""
