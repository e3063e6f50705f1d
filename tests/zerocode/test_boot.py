"""The boot module's import watch (gpudash/zerocode/_boot/sitecustomize.py), in-process: a watched module is
watched until it has been executed, not until someone first looks it up; an import that fails is watched again."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BOOT = Path(__file__).resolve().parents[2] / "gpudash" / "zerocode" / "_boot" / "sitecustomize.py"


@pytest.fixture
def boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("GPUDASH_RUN_DIR", raising=False)
    spec = importlib.util.spec_from_file_location("_i42_boot_under_test", BOOT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not named sitecustomize, no run dir: installs nothing by itself
    seen: list[tuple[str, ModuleType]] = []
    monkeypatch.setattr(mod, "_imported", lambda name, module: seen.append((name, module)))
    finder = mod._WhenImported()
    finder.pending = {"fake_torch"}
    monkeypatch.setattr(mod, "_FINDER", finder)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield mod, finder, seen, tmp_path
    sys.modules.pop("fake_torch", None)


def test_a_lookup_does_not_end_the_watch(boot: Any) -> None:
    _, finder, seen, where = boot
    (where / "fake_torch.py").write_text("VALUE = 42\n")
    for _ in range(3):  # transformers, datasets and accelerate each ask before anything imports it
        assert importlib.util.find_spec("fake_torch") is not None
    assert seen == [] and finder.pending == {"fake_torch"}
    module = importlib.import_module("fake_torch")
    assert seen == [("fake_torch", module)] and module.VALUE == 42
    assert module.__loader__ is module.__spec__.loader and type(module.__loader__).__name__ != "_Loader"
    assert finder.pending == set()


def test_a_failed_import_is_watched_again(boot: Any) -> None:
    _, finder, seen, where = boot
    (where / "fake_torch.py").write_text("raise ImportError('not built yet')\n")
    with pytest.raises(ImportError):
        importlib.import_module("fake_torch")
    assert seen == [] and finder.pending == {"fake_torch"}
    (where / "fake_torch.py").write_text("VALUE = 1\n")
    importlib.invalidate_caches()
    sys.modules.pop("fake_torch", None)
    module = importlib.import_module("fake_torch")
    assert seen == [("fake_torch", module)]
