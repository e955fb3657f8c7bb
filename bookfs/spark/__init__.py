"""Spark over a mount: the pipeline (:mod:`~bookfs.spark.pipeline`: a session, ``binaryFile``
reads, Parquet by day), the rows both read (:mod:`~bookfs.spark.rows`: columns, decoding,
segment planning), the data source (:mod:`~bookfs.spark.source`:
``spark.read.format("bookfs")`` and ``readStream``) and ``bookfs spark``
(:mod:`~bookfs.spark.cli`).

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
