"""A server's storage: its SQLite store (`store.Store`, over the tables of `schema`, handing out and
refusing what `records` names) and the columnar segments a reconciled task's key shares are written
to for evaluation (`segments`). Used by the protocols and the server; knows nothing of HTTP."""
from .records import (AlreadyAnswered, CheckBatch, CollectionClosed, CollectionOpen, Exchange, Frozen, Mark,
                      SegmentFile, StoreError, UnknownTask)
from .store import Store

__all__ = ["AlreadyAnswered", "CheckBatch", "CollectionClosed", "CollectionOpen", "Exchange", "Frozen", "Mark",
           "SegmentFile", "Store", "StoreError", "UnknownTask"]
