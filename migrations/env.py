"""Alembic environment: migrates the database named in the Alembic config."""

from __future__ import annotations

from alembic import context

from service.persistence.engine import make_engine
from service.persistence.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url, "set sqlalchemy.url (service.persistence.migrate does)"
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
