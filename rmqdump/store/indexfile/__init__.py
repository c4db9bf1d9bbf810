"""IndexFile reading, querying and writing (spec §9).

Readers use ``os.pread`` of the header, one slot and the chain's entries only, so a lookup
in a 400 MiB file touches a few pages. The writer works on a writable mmap of a (sparse)
pre-sized file and implements ``IndexFile.putKey`` exactly; :meth:`IndexFileWriter.bulk_put`
does the same for arrays of hashes with numpy when it is installed.

The geometry (and its inference), header and entry are in :mod:`~rmqdump.store.indexfile.layout`,
the reader and the queries in :mod:`~rmqdump.store.indexfile.reader`, the writer and the builder in
:mod:`~rmqdump.store.indexfile.writer`; their names are re-exported here.
"""

from __future__ import annotations

from rmqdump.store.indexfile.layout import (
    DEFAULT_GEOMETRY,
    DEFAULT_INDEX_PER_SLOT,
    IndexEntry,
    IndexGeometry,
    IndexHeader,
    geometry_from_entries,
    index_file_size,
    infer_geometry,
)
from rmqdump.store.indexfile.reader import LONG_MAX, IndexFile, IndexStore, QueryResult, list_index_files, slot_of
from rmqdump.store.indexfile.reader import _bad_prev as _bad_prev

#: the writer's names, imported on first use: a reader (``rmqdump lookup``) never loads the writer
_WRITER = frozenset({"INDEX_FILE_NAME_LENGTH", "INT_MAX", "IndexBuilder", "IndexFileWriter", "build_index_entries",
                     "build_index_keys", "index_file_name", "key_hashes", "record_index_keys"})


def __getattr__(name: str):
    if name in _WRITER:
        from rmqdump.store.indexfile import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_GEOMETRY", "DEFAULT_INDEX_PER_SLOT", "INDEX_FILE_NAME_LENGTH", "INT_MAX", "LONG_MAX",
           "IndexBuilder", "IndexEntry", "IndexFile", "IndexFileWriter", "IndexGeometry", "IndexHeader",
           "IndexStore", "QueryResult", "build_index_entries", "build_index_keys", "geometry_from_entries",
           "index_file_name", "index_file_size", "infer_geometry", "key_hashes", "list_index_files", "record_index_keys",
           "slot_of"]
