"""rmqdump: read, verify and repair Apache RocketMQ broker stores offline.

The core library knows nothing of the CLI or Spark. Main entry points::

    from rmqdump import Store, CommitLog
    store = Store.open("/data/store")
    for rec in store.commitlog.walk():
        ...
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "CommitLog", "Store", "Message", "Blank", "Invalid", "RmqdumpError"]


def __getattr__(name: str):
    # Lazy re-exports keep `import rmqdump` (and `rmqdump --help`) cheap.
    if name == "CommitLog":
        from rmqdump.store.commitlog import CommitLog
        return CommitLog
    if name == "Store":
        from rmqdump.store.root import Store
        return Store
    if name in ("Message", "Blank", "Invalid"):
        from rmqdump.codec import record
        return getattr(record, name)
    if name == "RmqdumpError":
        from rmqdump.errors import RmqdumpError
        return RmqdumpError
    raise AttributeError(name)
