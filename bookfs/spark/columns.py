"""The columns of ``format("bookfs")`` and the projections a read may ask for (issue 22).

Spark 4.3's Python data source API prunes no column by itself, so a query that needs only
some columns names them: ``.schema("event long, size long")`` (Spark hands that schema to
the reader) or ``.option("columns", "event,size")`` (then :meth:`schema` answers it).
:func:`projection` turns the read schema into the list of columns to make, checked
against the table's own (:data:`bookfs.spark.rows.SCHEMA`, and :data:`SHIP` for a load of
many mounts): a column the table does not have, or of another type, is refused in one
line.
"""

from __future__ import annotations

from bookfs.spark.rows import COLUMNS

#: The column a load of several mounts adds: the ship's @p.
SHIP = "ship"


def spark_types() -> dict:
    """Each column's Spark type (:data:`SCHEMA`, and :data:`SHIP`)."""
    from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType,
                                   TimestampType)

    ts = TimestampType()
    return {"event": LongType(), "epoch": LongType(), "mug": IntegerType(),
            "size": LongType(), "jam": BinaryType(), "committed_at": ts, "date": ts,
            "wire": StringType(), "card": StringType(), "error": StringType(),
            SHIP: StringType()}


def all_columns(multi: bool) -> list[str]:
    """The table's columns: :data:`COLUMNS`, and :data:`SHIP` for a load of many mounts."""
    return COLUMNS + [SHIP] if multi else list(COLUMNS)


def option_columns(options, multi: bool) -> list[str] | None:
    """The ``columns`` option (``"event,size"``) as a list, checked; None when absent."""
    raw = options.get("columns")
    if raw is None or not raw.strip():
        return None
    names = [c.strip() for c in raw.split(",")]
    known = all_columns(multi)
    for c in names:
        if c not in known:
            raise ValueError(f"option columns: no column {c!r}; expected some of "
                             f"{', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"option columns names a column twice: {raw!r}")
    return names


def projection(schema, multi: bool) -> list[str] | None:
    """The columns to produce for the read schema Spark hands the reader (the user's
    ``.schema(...)``, or :meth:`BookfsDataSource.schema`'s): None for the whole table
    (nothing to leave out), else their names in the schema's order.  Each must be a
    column of the table with its type: a one-line ValueError otherwise."""
    known, types = all_columns(multi), spark_types()
    names = [f.name for f in schema.fields]
    if names == known:
        return None
    for f in schema.fields:
        if f.name not in types or f.name not in known:
            raise ValueError(f"schema column {f.name!r} is not a column of "
                             f'format("bookfs"); expected some of {", ".join(known)}')
        if f.dataType != types[f.name]:
            raise ValueError(f"schema column {f.name!r} is {f.dataType.simpleString()}; "
                             f"format(\"bookfs\") gives {types[f.name].simpleString()}")
    if len(set(names)) != len(names):
        raise ValueError(f"schema names a column twice: {', '.join(names)}")
    return names
