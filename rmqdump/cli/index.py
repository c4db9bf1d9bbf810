"""`rmqdump index`: index files — headers, geometry checks, slot occupancy, chain lengths, entries."""

from __future__ import annotations

import click

from rmqdump.cli.geometry import geometry_options, resolve
from rmqdump.cli.options import output_options, store_argument
from rmqdump.cli.output import Column

TABLE_COLUMNS = [
    Column("file", "FILE", "fixed", 5), Column("number", "ENTRY", "num", 0), Column("key_hash", "KEYHASH", "num", 1),
    Column("slot", "SLOT", "num", 2), Column("phy_offset", "PHY OFFSET", "num", 0),
    Column("time_diff", "TIMEDIFF", "num", 6), Column("time", "TIME", "num", 4), Column("prev_index", "PREV", "num", 3),
]


def render(console, doc: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    from rmqdump.cli.output import escape_control, iso_ms

    g = doc["geometry"]
    console.print(Text(escape_control(f"index geometry: {g['hash_slot_num']} slots / {g['index_num']} entries "
                                      f"({g['source']})"), style="bold"))
    for p in doc["geometry_problems"]:
        console.print(Text(escape_control(p), style="yellow"))
    if doc["abort_present"]:
        console.print(Text("abort present: files marked 'deleted' are removed by the broker's next (abnormal) start",
                           style="yellow"))
    for f in doc["files"]:
        if "error" in f:
            console.print(Text(escape_control(f"{f['file']}: {f['error']}"), style="red"))
            continue
        state = " (full)" if f["full"] else ""
        state += " (deleted by abnormal restart)" if f["deleted_by_abnormal_restart"] else ""
        console.print(Text(escape_control(f"{f['file']}{state}: {f['entries']} entries, time "
                                          f"{iso_ms(f['begin_timestamp'])} .. {iso_ms(f['end_timestamp'])}, "
                                          f"phy offsets {f['begin_phy_offset']} .. {f['end_phy_offset']}"),
                           style="bold"))
        if "used_slots" in f:
            console.print(f"  slots used: {f['used_slots']} ({f['slot_occupancy']:.2%}), header hashSlotCount "
                          f"{f['hash_slot_count']}; chains: max {f['max_chain_length']}, mean "
                          f"{f['mean_chain_length']}", highlight=False)
            t = Table(box=None, title=None)
            t.add_column("chain length", justify="right")
            t.add_column("slots", justify="right")
            for length, n in f["chain_length_histogram"].items():
                t.add_row(length, str(n))
            console.print(t)
        for p in f["problems"]:
            console.print(Text(escape_control(f"  {p}"), style="red"))


@click.command()
@store_argument
@click.option("--file", "name", default=None, metavar="NAME", help="Only this index file (its 17-digit name).")
@click.option("--entries", is_flag=True, help="Print every written entry instead of the summary.")
@click.option("--headers-only", is_flag=True, help="Summary from headers and a sample of slots only (fast).")
@output_options
@geometry_options
def index(store, name, entries, headers_only, fmt, quiet, index_slots, index_entries, broker_config):
    """Dump the index files of STORE.

    Summary per file: header (time and commitlog offset range, hashSlotCount, indexCount),
    whether the broker's next abnormal start deletes it, slot occupancy, chain-length
    histogram and structural checks (every entry chained from the slot its hash selects,
    every slot holding its last entry) — which also checks the geometry inferred from the
    file size. Exit 1 if a check fails. --entries prints the entries in write order.
    """
    from rmqdump.cli.output import RecordWriter, default_format, emit_document
    from rmqdump.errors import NotFoundError
    from rmqdump.store.root import Store

    fmt = default_format(fmt)
    st = Store.open(store)
    if st.root is None:
        raise NotFoundError("index needs a store root (only commitlog files were given)", store)
    geo = resolve(st, index_slots, index_entries, broker_config, None, ("index",))
    if geo.index_hash_slot_num is None:
        from rmqdump.errors import FormatError
        from rmqdump.store.geometry import geometry_hint

        raise FormatError(f"{'; '.join(geo.problems)}; {geometry_hint()}")
    if entries:
        from rmqdump.analysis.dumps import INDEX_ENTRY_FIELDS
        from rmqdump.analysis.dumps import index_entries as iter_entries

        writer = RecordWriter(fmt, INDEX_ENTRY_FIELDS, TABLE_COLUMNS)
        try:
            for row in iter_entries(st.root, geo, name):
                writer.write(row)
        finally:
            writer.close()
        return
    if fmt == "csv":
        raise click.BadParameter("the summary is a document: use table, json or jsonl (or --entries for csv)",
                                 param_hint="--format")
    from rmqdump.analysis.dumps import index_summary

    doc = index_summary(st, geo, name, analyse=not headers_only)
    emit_document(doc, fmt, render)
    if doc["geometry_problems"] or any("error" in f or f.get("problems") for f in doc["files"]):
        raise SystemExit(1)
