"""Reprotrain service: the API, its database and queue, verification, the dashboard and the
`repro` command line."""
