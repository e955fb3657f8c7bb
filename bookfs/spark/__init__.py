"""Spark over a mount.

``pipeline``    a session, ``binaryFile`` reads of a mount, Parquet by day
``rows``        the rows of the event table as Arrow batches, made in the Python workers
``decoding``    the columns and what one payload gives them: the reference both row
                builders follow (the compiled one is ``_rows.pyx``)
``columns``     the columns of ``format("bookfs")`` and the projections a read may ask for
``partitions``  what one task reads, and how a read is cut into tasks
``source``      ``spark.read.format("bookfs")`` and ``readStream``: the data source
``master``      is ``spark://HOST:PORT`` a Spark master (before Spark starts)
``summary``     what a ``bookfs spark`` run prints when it is done
``cli``         ``bookfs spark MOUNTPOINT --out DIR``

``from bookfs import spark as bs`` gives the public names of the pipeline and the rows;
``bs.ROWS`` says which row builder the workers use (``"compiled"``,
``bookfs/spark/_rows.pyx``, or ``"pure"``; ``bs.ROWS_REASON`` why), as
``bookfs.noun.CORE`` says of the noun core.
"""
from bookfs.spark.pipeline import (DAY, DEFAULT_MAX_LENGTH, MAX_LENGTH_KEY, NULL_PARTITION,
                                   ROW_GROUP_KEY, TUNED, EventTooLarge, day_column,
                                   read_events, register, session, tune, write_parquet)
from bookfs.spark.rows import (COLUMNS, ROWS, ROWS_REASON, SCHEMA, plan_segments,
                               rows_description)

__all__ = ["COLUMNS", "DAY", "DEFAULT_MAX_LENGTH", "MAX_LENGTH_KEY", "NULL_PARTITION",
           "ROWS", "ROWS_REASON", "ROW_GROUP_KEY", "SCHEMA", "TUNED", "EventTooLarge",
           "day_column", "plan_segments", "read_events", "register", "rows_description",
           "session", "tune", "write_parquet"]
