"""DLedger commitlog stores (``enableDLegerCommitLog``): ``dledger-<id>/data`` (entries wrapping commitlog
records), ``dledger-<id>/index`` (32-byte units), ``checkpoint`` and ``currterm``.

``files``: the directory and its text files, which segments are DLedger data files, one entry at a
position; ``log``: :class:`~rmqdump.store.dledger.log.DLedgerCommitLog`, the commitlog of such a store
(walked by :class:`rmqdump.store.commitlog.Walk`, which unwraps the entries). Nothing is imported here:
``store.commitlog`` imports ``files``, and ``log`` imports ``store.commitlog``.
"""
