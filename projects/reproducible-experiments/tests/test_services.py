"""The PostgreSQL switch: absent PostgreSQL skips, unless `REQUIRE_POSTGRES=1`."""

from conftest import postgres_absent_outcome


def test_absent_postgres_skips_or_fails_as_configured():
    assert postgres_absent_outcome({})[0] == "skip"
    assert postgres_absent_outcome({"REQUIRE_POSTGRES": "0"})[0] == "skip"
    outcome, reason = postgres_absent_outcome({"REQUIRE_POSTGRES": "1"})
    assert outcome == "fail" and reason.startswith("REQUIRE_POSTGRES=1 but PostgreSQL is not")
