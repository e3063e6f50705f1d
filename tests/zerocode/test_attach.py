"""``gpudash run`` attaches however torch arrives: looked up before it is imported (what transformers, datasets
and accelerate do), imported by name, after Hugging Face / Lightning libraries, in a spawned child, under
``python -m``, under a console script (torchrun, accelerate launch, fabric run). Each records exactly the
optimizer steps and losses the script prints."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

#: the training loop every case runs after its own way of getting torch (``torch`` bound by then)
TRAIN = """
def train(torch, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.8f}", flush=True)
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _record(tmp_path: Path, *command: str, steps: int = 3) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "run"), "--", *command],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [float(x) for x in re.findall(r"^loss (\S+)$", proc.stdout, re.M)]
    assert len(printed) == steps, proc.stdout
    assert "no step recorded" not in proc.stderr
    run = load_run(tmp_path / "run")
    try:
        assert run.status == "finished" and run.ranks == [0]
        s = run.steps
        assert list(s["step"]) == list(range(steps))
        assert list(s["loss"]) == pytest.approx(printed, abs=1e-7)
        assert (s["samples"] == 8).all()
    finally:
        run.close()
    return proc


def _script(tmp_path: Path, prelude: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(f"{prelude}\n{TRAIN}\nif __name__ == '__main__':\n    train(torch)\n")
    return path


PRELUDES = {
    "find_spec first": "import importlib.util\nassert importlib.util.find_spec('torch') is not None\nimport torch",
    "import_module": "import importlib\ntorch = importlib.import_module('torch')",
    "transformers first": "import transformers\nfrom transformers import AutoConfig  # noqa: F401\nimport torch",
    "accelerate first": "import accelerate  # noqa: F401\nimport torch",
    "lightning first": "import lightning  # noqa: F401\nimport torch",
    "datasets first": "import datasets  # noqa: F401\nimport torch",
    "deepspeed first": "import deepspeed  # noqa: F401\nimport torch",
}
NEEDS = {"transformers first": "transformers", "accelerate first": "accelerate", "lightning first": "lightning",
         "datasets first": "datasets", "deepspeed first": "deepspeed"}


@pytest.mark.parametrize("case", list(PRELUDES))
def test_torch_however_it_is_imported(tmp_path: Path, case: str) -> None:
    if case in NEEDS and importlib.util.find_spec(NEEDS[case]) is None:
        pytest.skip(f"{NEEDS[case]} is not installed in this environment")
    _record(tmp_path, sys.executable, str(_script(tmp_path, PRELUDES[case])))


def test_python_dash_m_module(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _script(pkg, "import torch", "train_mod.py")
    _record(tmp_path, sys.executable, "-m", "mypkg.train_mod")


@pytest.mark.slow
def test_a_spawned_child_that_trains_is_the_run(tmp_path: Path) -> None:
    """The parent only starts a ``multiprocessing`` spawn child, which imports torch and trains: the child is the
    run (rank 0), recorded exactly."""
    script = tmp_path / "spawned.py"
    script.write_text(f"{TRAIN}\ndef child():\n    import torch\n    train(torch)\n\n"
                      "if __name__ == '__main__':\n    import multiprocessing as mp\n"
                      "    p = mp.get_context('spawn').Process(target=child)\n    p.start()\n    p.join()\n"
                      "    raise SystemExit(p.exitcode)\n")
    _record(tmp_path, sys.executable, str(script))


@pytest.mark.slow
def test_dataloader_workers_spawned_do_not_record(tmp_path: Path) -> None:
    """DataLoader workers started with spawn import torch but never train: the run is the main process's steps
    only (one rank, the script's optimizer steps), whether the workers start before it records or after."""
    script = tmp_path / "workers.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "if __name__ == '__main__':\n"
        "    torch.manual_seed(0)\n"
        "    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context='spawn')\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):  # the second epoch's workers start after recording began\n"
        "        for x, y in loader:\n"
        "            loss = (model(x) - y).pow(2).mean()\n"
        "            opt.zero_grad()\n"
        "            loss.backward()\n"
        "            opt.step()\n"
        "            print(f'loss {loss.item():.8f}', flush=True)\n")
    _record(tmp_path, sys.executable, str(script), steps=8)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate launch", "fabric run"])
def test_console_script_launchers(tmp_path: Path, launcher: str) -> None:
    script = str(_script(tmp_path, "import torch"))
    if launcher == "torchrun":
        command = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "1", script]
    elif launcher == "accelerate launch":
        command = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", script]
    else:
        command = [str(BIN / "fabric"), "run", "--accelerator", "cpu", "--devices", "1", script]
    if not Path(command[0]).exists() or shutil.which(command[0]) is None:
        pytest.skip(f"{launcher} is not installed in this environment")
    _record(tmp_path, *command)
