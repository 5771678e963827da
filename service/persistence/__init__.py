"""The database: engines and sessions, models, migrations and SQL helpers, and owner-only
files for what the server keeps on disk."""
