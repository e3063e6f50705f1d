"""Object stores other than S3 (issue 45): ``gs://`` and ``az://`` go through fsspec's drivers (gcsfs, adlfs); where
those are not installed (CI has no network and no emulator), fsspec's in-memory filesystem stands in under their
own protocol names, so the same code records, lists, opens and range-reads a run; a missing driver is one line."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers.s3 import forget_served, record_run

from gpudash import load_run
from gpudash.errors import RunError, UserError
from gpudash.server.layouts import runs as page
from gpudash.store import mirror, publish, sharedfs
from gpudash.store.objstore import open_store
from gpudash.store.ranged import read_published
from gpudash.store.runsync import RunsMirror


class _Stand(MemoryFileSystem):
    """fsspec's in-memory filesystem under another protocol name (its own objects)."""

    store: dict = {}  # type: ignore[type-arg]
    pseudo_dirs = [""]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv(sharedfs.LOCAL_DIR_ENV, str(tmp_path / "local"))
    monkeypatch.setattr(publish, "PUBLISH_INTERVAL_S", 0.0)
    monkeypatch.setattr(mirror, "SYNC_S", 0.0)
    forget_served()
    yield
    forget_served()
    MemoryFileSystem.store.clear()
    _Stand.store.clear()


def _stand_in(monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    cls = type(f"Stand_{protocol}", (_Stand,), {"protocol": protocol, "store": {}, "pseudo_dirs": [""]})
    registry = importlib.import_module("fsspec.registry")._registry  # the package's own name is its read-only view
    monkeypatch.setitem(registry, protocol, cls)


@pytest.mark.parametrize("protocol", ["memory", "gs", "az"])
def test_a_run_in_another_store_is_recorded_listed_opened_and_range_read(protocol: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if protocol != "memory":
        _stand_in(monkeypatch, protocol)
    record_run(f"{protocol}://team/runs/a", 9)
    store = open_store(f"{protocol}://team/runs/a")
    assert type(store.fs).protocol in (protocol, (protocol,)) or protocol in type(store.fs).protocol
    listing = RunsMirror(f"{protocol}://team/runs", tmp_path / "listed")
    assert listing.sync_once() == 2  # run.json and the rank's meta.json: no segment
    rows = page.list_page(listing.local).rows
    assert [(r["id"], r["status"], r["steps"]) for r in rows] == [("a", "finished", 9)]
    run = load_run(listing.local / "a")  # opened: its segments fetched from the store now
    try:
        assert run.steps["step"].tolist() == list(range(9)) and not run.problems
    finally:
        run.close()
    tab = read_published(f"{protocol}://team/runs/a", "steps", ["step", "loss"], after=4)
    assert tab["step"].to_pylist() == [4, 5, 6, 7, 8] and "loss" in tab.column_names


@pytest.mark.parametrize(("url", "package", "extra"), [("gs://bucket/runs", "gcsfs", "gcs"),
                                                       ("az://container/runs", "adlfs", "azure"),
                                                       ("abfs://container/runs", "adlfs", "azure")])
def test_a_missing_driver_is_one_line_naming_the_package(url: str, package: str, extra: str) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here: its real driver is used")
    with pytest.raises(RunError) as err:
        open_store(url)
    line = str(err.value)
    assert "\n" not in line and package in line and f"pip install 'gpudash[{extra}]'" in line, line
    from gpudash.commands import serve

    with pytest.raises(UserError, match=package):  # ``gpudash serve az://...``: the same line, no traceback
        serve._mirror(url)


def test_a_ranged_read_of_a_folder_refuses_a_fifo_and_a_link(tmp_path: Path) -> None:
    import os

    from gpudash.store.bounded import UnsafeFile
    from gpudash.store.ranged import open_ranged

    seg = tmp_path / "run" / "segments" / "rank=0" / "steps"
    seg.mkdir(parents=True)
    name = "segments/rank=0/steps/000000000000-000000000010.parquet"
    store = open_store(tmp_path / "run")
    os.mkfifo(tmp_path / "run" / name)  # a reader opening it plainly would wait for a writer forever
    with pytest.raises(UnsafeFile, match="not a regular file"):
        open_ranged(store, name)
    assert read_published(store, "steps", ["step"]).num_rows == 0  # never listed as a segment either
    (tmp_path / "run" / name).unlink()
    (tmp_path / "secret").write_bytes(b"PAR1" * 100)
    (tmp_path / "run" / name).symlink_to(tmp_path / "secret")
    with pytest.raises(UnsafeFile):
        open_ranged(store, name)
    assert read_published(store, "steps", ["step"]).num_rows == 0


def test_a_store_without_credentials_names_where_they_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoAccount(_Stand):
        protocol = "az"

        def __init__(self, *a: object, **k: object) -> None:  # as adlfs does with no account in the environment
            raise ValueError("Must provide either a connection_string or account_name with credentials!!")

    registry = importlib.import_module("fsspec.registry")._registry
    monkeypatch.setitem(registry, "az", NoAccount)
    with pytest.raises(RunError) as err:
        open_store("az://container/runs/a")
    line = str(err.value)
    assert "\n" not in line and "AZURE_STORAGE_CONNECTION_STRING" in line and "az://container/runs/a" in line
