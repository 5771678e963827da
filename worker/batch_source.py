"""The plugin contract at its documented path: `worker.data.batch_source`, re-exported.

Plugins written against `from worker.batch_source import BatchSource, DataInfo` keep working.
"""

from worker.data.batch_source import BatchSource, DataInfo

__all__ = ["BatchSource", "DataInfo"]
