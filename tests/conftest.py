"""Repository-level tests. `fixtures/` holds projects that these tests run the
matrix's checks on; their own test files are not tests of this repository."""

collect_ignore = ["fixtures"]
