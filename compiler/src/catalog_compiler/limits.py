"""What a source file may hold: the loading limits (each a LIM rule).

The catalog never comes near them (its files are a few kilobytes, nested a
handful of levels, without aliases); they exist so that a damaged or hostile
file is refused before it costs time or memory.
"""

MAX_FILE_BYTES = 1024 * 1024
"""LIM004: a source file larger than this is not read.

150 times the largest catalog file, and room for the 100x synthetic catalog
of ``bench_compile.py``; the pure-Python YAML scanner needs some seconds for
a file of this size, so the limit also bounds the time of one file.
"""

MAX_DEPTH = 32
"""LIM001: lists and mappings nested deeper than this (the root counts as 1)."""

MAX_ALIASES = 64
"""LIM002: YAML aliases (``*name``) in one file."""

MAX_VALUES = 200_000
"""LIM003: values in one YAML file once its aliases are expanded."""

MAX_ID_LENGTH = 64
"""ID005: characters of an id (role and project ids become file names)."""
