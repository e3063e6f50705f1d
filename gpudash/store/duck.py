"""DuckDB over a run's published segments where they are (a folder, ``s3://``, ``gs://``, ``az://``), no copy.

:func:`connect` gives a DuckDB connection with the run's fsspec filesystem registered (the same driver,
credentials, endpoint and timeouts gpudash itself reads the store with: :mod:`gpudash.store.objstore`), so
``read_parquet`` reads the bucket directly, in ranges; :func:`segments_glob` is the glob of one table's
segments of every rank (``rank`` is a Hive partition)::

    from gpudash.store.duck import connect, segments_glob
    con = connect("s3://bucket/runs/exp1")
    con.sql(f"SELECT rank, step, loss FROM read_parquet('{segments_glob('s3://bucket/runs/exp1', 'steps')}', "
            "hive_partitioning = true, union_by_name = true)")

DuckDB is not a dependency of gpudash: ``pip install duckdb``.
"""

from __future__ import annotations

from typing import Any

from gpudash.errors import RunError
from gpudash.store.objstore import open_store
from gpudash.store.segments import SEGMENTS_DIR

__all__ = ["connect", "segments_glob"]


def segments_glob(location: str, table: str) -> str:
    """The ``read_parquet`` glob of ``table``'s segments of every rank of the run at ``location``."""
    return f"{str(location).rstrip('/')}/{SEGMENTS_DIR}/*/{table}/*.parquet"


def connect(location: str, con: Any = None) -> Any:
    """A DuckDB connection (``con``, else a new in-memory one) that reads ``location``'s store through fsspec."""
    try:
        import duckdb
    except ImportError:
        raise RunError("querying segments with DuckDB needs the package duckdb; pip install duckdb") from None
    store = open_store(location)
    con = duckdb.connect() if con is None else con
    if store.remote:
        con.register_filesystem(store.fs)
    return con
