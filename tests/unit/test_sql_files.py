"""The migration splitter: statements end at a line ending with ``;`` — except inside a
dollar-quoted body, so a PL/pgSQL function is one statement."""

from __future__ import annotations

from fleetcron.stores.sql.files import load_migrations, split_statements


def test_plain_statements_split_at_lines_ending_with_a_semicolon() -> None:
    text = "-- a comment\nCREATE TABLE a (x int);\n\nCREATE INDEX i\n    ON a (x);\n"

    assert split_statements(text) == ("CREATE TABLE a (x int)", "CREATE INDEX i\n    ON a (x)")


def test_a_dollar_quoted_function_body_is_one_statement() -> None:
    text = (
        "CREATE TABLE a (x int);\n"
        "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\n"
        "DECLARE\n"
        "    v int;\n"
        "BEGIN\n"
        "    -- a comment inside the body is kept\n"
        "\n"
        "    SELECT 1 INTO v;\n"
        "    RETURN v;\n"
        "END;\n"
        "$$;\n"
        "CREATE TABLE b (y int);\n"
    )

    statements = split_statements(text)

    assert len(statements) == 3
    assert statements[0] == "CREATE TABLE a (x int)"
    assert statements[1].startswith("CREATE FUNCTION f()")
    assert statements[1].endswith("END;\n$$")
    assert "    SELECT 1 INTO v;" in statements[1]
    assert "-- a comment inside the body is kept" in statements[1]
    assert statements[2] == "CREATE TABLE b (y int)"


def test_tagged_dollar_quotes_nest_other_quotes() -> None:
    text = (
        "CREATE FUNCTION g() RETURNS text LANGUAGE sql AS $body$\n"
        "    SELECT $$x;$$;\n"
        "$body$;\n"
        "SELECT 1;\n"
    )

    assert split_statements(text) == (
        "CREATE FUNCTION g() RETURNS text LANGUAGE sql AS $body$\n    SELECT $$x;$$;\n$body$",
        "SELECT 1",
    )


def test_the_postgres_ledger_migration_keeps_each_function_whole() -> None:
    ledger = next(m for m in load_migrations("postgres") if m.version == 2)
    functions = [s for s in ledger.statements if "CREATE OR REPLACE FUNCTION" in s]

    assert len(functions) == 4
    assert all(s.rstrip().endswith("$$") for s in functions)
    assert all(s.count("$$") == 2 for s in functions)
