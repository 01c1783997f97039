"""catalog_compiler: validate the JAX Pathways role catalog against the
projects on disk and publish its route documents (JSON, text, HTML site)."""
