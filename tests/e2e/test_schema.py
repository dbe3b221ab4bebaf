"""The migrations (what `db.init` applies) build exactly the tables of db/sql.py."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from db.sql import metadata


def test_migrations_match_db_sql(dbs):
    engine = create_engine(dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
            indexes = {t: {i["name"]: i["column_names"] for i in inspect(conn).get_indexes(t)}
                       for t in metadata.tables}
    finally:
        engine.dispose()
    assert diff == []
    for table in metadata.tables.values():
        declared = {i.name: [c.name for c in i.columns] for i in table.indexes}
        assert {name: indexes[table.name][name] for name in declared} == declared
