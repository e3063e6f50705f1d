"""GPU validation pack (issue 7): everything the rare GPU minutes must prove, in one run.

    scripts/device_check.sh OUT_DIR            # or OUT=... scripts/device_check.sh

Writes into OUT_DIR:
  env.json              driver, torch, NVML, GPM support, PCIe link, py-spy permission
  runs/                 gpudash runs: the strategy matrix and the consumer-card emulation
  strategies.md         peak memory by category and step time per cell, vs plain fp32
  cards.md              per emulated card (24/16/8 GB): largest model and batch that trains,
                        techniques needed, real OOMs recovered from
  estimator.md          predicted vs measured peak per cell (error %)
  leak.md               the leak rule on a loop keeping its losses (and the fixed loop): the live event's
                        growth per step against the bytes the loop keeps, and the frames the snapshot diff names
  collectors.txt        collector costs (benchmarks/collectors.py) and Monitor overhead ratio
  micro.txt             issue 41's microbenchmark (benchmarks/overhead.py --parts 5) on the device host's CPU
  fixtures/             allocator snapshot pickle + NVML recording for the CPU tests
  samples/              two small trainer runs on the GPU for sample_runs/: healthy, and an OOM with its snapshot
  graphs.md             the retained-graph and gradient-penalty loops' growth on the GPU, bare vs gpudash run
  live.md               live latency: a step's end to its row read back by a reader polling like the page
  gpu_tests.txt         the test files that skip without CUDA, run on the GPU
  summary.json          every number above, machine-readable

On a machine without CUDA it runs the same steps with the tiny preset and
marks GPU-only parts "skipped (no GPU)", so CI proves the script itself works.
Every trainer run is a subprocess with its own timeout: one hang cannot eat
the whole GPU slot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gpudash  # noqa: E402
from gpudash.units import human_bytes  # noqa: E402

GB = 1024**3
CATEGORIES = ("params", "grads", "optimizer", "activations")
#: time.monotonic() after which no part or run starts (--deadline); runs get only what is left
DEADLINE = float("inf")
#: the trainer runs share the GPU with other parts' runs (--jobs > 1): their step times and energy are not theirs
SHARED = False
#: trainer runs of one part at once and parts side by side (--jobs)
JOBS = 1


def left() -> float:
    return DEADLINE - time.monotonic()


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# ---- 1. environment probe -----------------------------------------------------------------
def probe() -> dict[str, Any]:
    env: dict[str, Any] = {"time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                           "python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env.update(cuda=torch.version.cuda, gpu=p.name, gpu_memory_bytes=int(p.total_memory),
                       compute_capability=f"{p.major}.{p.minor}", bf16=torch.cuda.is_bf16_supported())
            env["library_workspaces"] = workspaces(torch)
    except ImportError as exc:
        env["torch"] = f"not installed ({exc})"
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=driver_version,name,pcie.link.gen.current,pcie.link.width.current",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    env["nvml"] = probe_nvml()
    env["py_spy"] = probe_pyspy()
    return env


def workspaces(torch: Any) -> dict[str, Any]:
    """What the caching allocator holds after the CUDA libraries' first calls, beyond the tensors themselves
    (cuBLAS / cuBLASLt workspaces, SDPA's): the estimator's unexplained ~50-85 MiB "other" on the H200."""
    import torch.nn.functional as F

    out: dict[str, Any] = {}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    a = torch.randn(1024, 1024, device="cuda")
    tensors = torch.cuda.memory_allocated() - base
    steps = [("fp32 matmul", lambda: a @ a), ("bf16 matmul", lambda: a.bfloat16() @ a.bfloat16()),
             ("bf16 autocast linear", lambda: torch.autocast("cuda", torch.bfloat16)(lambda: F.linear(a, a))()),
             ("sdpa bf16", lambda: F.scaled_dot_product_attention(*(torch.randn(8, 12, 1024, 64, device="cuda",
                                                                                 dtype=torch.bfloat16),) * 3))]
    for name, fn in steps:
        try:
            r = fn()
            torch.cuda.synchronize()
            del r
            out[name] = int(torch.cuda.memory_allocated() - base - tensors)
        except Exception as exc:  # noqa: BLE001 - a probe
            out[name] = f"{type(exc).__name__}: {exc}"
    out["reserved_bytes"] = int(torch.cuda.memory_reserved())
    return out


def probe_nvml() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver is a state
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"available": True, "driver": _call(pynvml.nvmlSystemGetDriverVersion), "devices": []}
    for i in range(int(_call(pynvml.nvmlDeviceGetCount) or 0)):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        gpm = _call(lambda h=h: pynvml.nvmlGpmQueryDeviceSupport(h))
        out["devices"].append({
            "index": i,
            "name": _call(lambda h=h: pynvml.nvmlDeviceGetName(h)),
            "pci_bus_id": _call(lambda h=h: pynvml.nvmlDeviceGetPciInfo(h).busId),
            "pcie_gen": _call(lambda h=h: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "pcie_width": _call(lambda h=h: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
            "gpm_supported": bool(getattr(gpm, "isSupportedDevice", 0)) if gpm is not None else False,
        })
    pynvml.nvmlShutdown()
    return out


def _call(fn: Any) -> Any:
    try:
        v = fn()
    except Exception as exc:  # noqa: BLE001
        return f"n/a ({type(exc).__name__})"
    return v.decode() if isinstance(v, bytes) else v


def probe_pyspy() -> dict[str, Any]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        return {"available": False, "reason": "py-spy not installed"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        out = subprocess.run([exe, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=30)
        ok = out.returncode == 0
        return {"available": ok, "reason": "" if ok else (out.stderr.strip().splitlines() or ["?"])[-1]}
    finally:
        child.kill()


# ---- trainer runs -------------------------------------------------------------------------
def train(run_dir: Path, timeout: float, **flags: Any) -> dict[str, Any]:
    """One `gpudash train` subprocess; returns what its run recorded."""
    cmd = [sys.executable, "-m", "gpudash", "train", "--run-dir", str(run_dir), "--no-progress"]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    t0 = time.time()
    timeout = min(timeout, left())
    if timeout < 15:
        return {"flags": flags, "rc": None, "error": "skipped (deadline)", "wall_s": 0.0, "run_dir": str(run_dir)}
    env = dict(os.environ)
    if SHARED:  # runs side by side: each its share of the cores (16 CPU Adam threads each timed out at 90 s)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (2 * JOBS))))  # two parts run trainers
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, err = proc.returncode, proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []
    except subprocess.TimeoutExpired:
        rc, err = -9, [f"timed out after {timeout:.0f} s"]
    res: dict[str, Any] = {"flags": flags, "rc": rc, "error": " ".join(err) if rc else "", "wall_s": time.time() - t0,
                           "run_dir": str(run_dir), "shared_gpu": SHARED}
    try:
        run = gpudash.load_run(run_dir)
    except gpudash.RunError as exc:
        res["error"] = res["error"] or str(exc)
        return res
    res.update(measure(run))
    run.close()
    return res


def measure(run: Any) -> dict[str, Any]:
    s, m, ev = run.steps, run.memory, run.events
    out: dict[str, Any] = {"status": run.status, "steps": len(s)}
    if len(s) > 2:
        tail = s.iloc[len(s) // 3:]  # skip warm-up steps
        out["step_s"] = float(tail["duration_s"].median())
        if "tokens" in tail and tail["tokens"].notna().any():
            out["tokens_per_s"] = float(tail["tokens"].sum() / tail["duration_s"].sum())
        for col in ("micro_batch", "batch_size"):
            if col in s:
                out["micro_batch_max"] = float(s[col].max())
                break
    # the categories' peaks and the measured peak as every surface reads them (one fact, one place): the
    # gradients' own peak is their full size (grads_total_bytes), not what the peak moment held
    from gpudash.analysis.facts import run_facts

    peaks = run_facts(run).peak_bytes
    for cat in CATEGORIES:
        if peaks.get(cat) is not None:
            out[f"{cat}_bytes"] = float(peaks[cat])  # type: ignore[arg-type]
    if peaks.get("measured") is not None:
        out["measured_peak_bytes"] = float(peaks["measured"])  # type: ignore[arg-type]
        out["peak_source"] = next((c for c in ("allocated_peak_bytes", "peak_bytes", "allocated_bytes")
                                   if c in m and m[c].notna().any()), "measured")
    else:
        cats = [f"{c}_bytes" for c in CATEGORIES if f"{c}_bytes" in out]
        if cats:
            out["measured_peak_bytes"] = sum(out[c] for c in cats)
            out["peak_source"] = "sum of categories (no allocator on CPU)"
    try:
        from gpudash.analysis.energy import run_energy
        from gpudash.analysis.facts import step_count

        energy = run_energy(run, step_count(s, run.meta))
        if energy is not None and energy.j_per_step is not None:
            out["j_per_step"] = float(energy.j_per_step)
            out["energy_source"] = energy.gpu_source or "cpu"
    except Exception as exc:  # noqa: BLE001 - the pack reports, never stops
        out["energy_error"] = f"{type(exc).__name__}: {exc}"
    est = run.meta.get("estimate") or {}
    if isinstance(est, dict) and est.get("peak_bytes"):
        out["predicted_peak_bytes"] = float(est["peak_bytes"])
        for cat in CATEGORIES:
            if est.get(f"{cat}_bytes") is not None:
                out[f"predicted_{cat}_bytes"] = float(est[f"{cat}_bytes"])
        if out.get("measured_peak_bytes"):
            out["estimator_error_pct"] = 100 * (out["predicted_peak_bytes"] / out["measured_peak_bytes"] - 1)
    # the prediction the trainer made for each step's own micro-batch against that step's measured peak (the run
    # meta's estimate is for the first micro-batch; the adaptive batch moves it). The first step is left out:
    # it holds no optimizer state yet
    meas = next((c for c in ("allocated_peak_bytes", "peak_bytes") if c in m and m[c].notna().any()), None)
    if meas and "predicted_peak_bytes" in m:
        both = m[m["step"] > m["step"].min()][[meas, "predicted_peak_bytes"]].dropna()
        both = both[both[meas] > 0]
        if len(both):
            out["estimator_step_error_pct"] = float(((both["predicted_peak_bytes"] / both[meas] - 1) * 100).median())
    if len(ev):
        kinds = ev["kind"].value_counts().to_dict()
        out["events"] = {str(k): int(v) for k, v in kinds.items()}
        out["ooms"] = int(kinds.get("oom", 0))
    return out


def strategies(out: Path, gpu: bool, steps: int, timeout: float, jobs: int = 1) -> list[dict[str, Any]]:
    presets = ["gpt2-124m", "gpt2-350m"] if gpu else ["tiny"]
    cells = [(c, p, o) for c in ("none", "block") for p in (("fp32", "bf16") if gpu else ("fp32",))
             for o in ("none", "optimizer")]
    batch = 8 if gpu else 4

    def one(preset: str, ckpt: str, prec: str, off: str) -> dict[str, Any]:
        name = f"strat-{preset}-{ckpt}-{prec}-{off}"
        r = train(out / "runs" / name, timeout, preset=preset, steps=steps, ckpt=ckpt, precision=prec,
                  offload=off, batch=batch)
        r.update(preset=preset, ckpt=ckpt, precision=prec, offload=off, name=name)
        print(f"  {name}: rc={r['rc']} steps={r.get('steps')} peak={human_bytes(r.get('measured_peak_bytes'))}"
              f" {r['error']}", flush=True)
        return r

    return pooled([(preset, *cell) for preset in presets for cell in cells], one, jobs)


def pooled(args: list[tuple[Any, ...]], fn: Any, jobs: int) -> list[dict[str, Any]]:
    """``fn(*a)`` for each ``a``, ``jobs`` at once (each is a subprocess: memory numbers are per process; step
    times of runs that share the GPU are not each one's alone), in the order given."""
    if jobs <= 1:
        return [fn(*a) for a in args]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(lambda a: fn(*a), args))


def cards(out: Path, gpu: bool, steps: int, timeout: float, jobs: int = 1) -> list[dict[str, Any]]:
    """Emulate consumer cards; per card, the largest preset that trains and what it needed."""
    if not gpu:
        # CPU: the same search against a measured-bytes budget, tiny preset only
        r = train(out / "runs" / "card-cpu-budget", timeout, preset="tiny", steps=steps, batch="auto",
                  memory_budget_gb=0.05, effective_batch=16, inject_oom_at_batch=8)
        r.update(card_gb=0.05, preset="tiny", technique="none/fp32", name="card-cpu-budget")
        return [r]
    mixes = [("none", "fp32", "none"), ("none", "bf16", "none"), ("block", "bf16", "none"),
             ("block", "bf16", "optimizer")]

    def card_runs(card: int) -> list[dict[str, Any]]:
        results = []
        for preset in ("gpt2-350m", "gpt2-124m"):
            for ckpt, prec, off in mixes:
                name = f"card{card}-{preset}-{ckpt}-{prec}-{off}"
                r = train(out / "runs" / name, timeout, preset=preset, steps=steps, ckpt=ckpt, precision=prec,
                          offload=off, batch="auto", effective_batch=64, memory_cap_gb=card)
                r.update(card_gb=card, preset=preset, technique=f"{ckpt}/{prec}/{off}", name=name)
                results.append(r)
                print(f"  {name}: rc={r['rc']} steps={r.get('steps')} ooms={r.get('ooms', 0)} {r['error']}",
                      flush=True)
                if r["rc"] == 0 and r.get("steps", 0) >= steps:
                    return results
        return results

    per_card = pooled([(24,), (16,), (8,)], lambda c: {"runs": card_runs(c)}, jobs)
    return [r for c in per_card for r in c["runs"]]


# ---- the leak rule (issue 37) --------------------------------------------------------------------------
def leak(out: Path, gpu: bool, timeout: float) -> dict[str, Any]:
    """tests/zoo/scripts/keep_losses.py under `gpudash run`, unchanged: keeping its losses (a leak the live watch
    must name, with frames from the snapshot diff on GPU) and keeping loss.item() (none)."""
    from gpudash.analysis.facts import run_facts
    from gpudash.analysis.leak import recorded_leaks

    script = ROOT / "tests" / "zoo" / "scripts" / "keep_losses.py"
    res: dict[str, Any] = {}
    for keep in ("tensor", "item"):
        run_dir = out / "runs" / f"leak-{keep}"
        cmd = [sys.executable, "-m", "gpudash", "run", "--run-dir", str(run_dir), "--host-hz", "20", "--leak-poll-s", "1",
               *(["--snapshot-every", "100"] if gpu else []), "--", sys.executable, str(script), "--keep", keep,
               "--steps", "600" if gpu else "250", "--device", "cuda" if gpu else "cpu",
               *(["--width", "4096", "--batch", "256"] if gpu else [])]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(15.0, min(timeout, left())))
        except subprocess.TimeoutExpired:
            res[keep] = {"error": f"timed out after {timeout:.0f} s"}
            continue
        kept = next((int(w) for line in proc.stdout.splitlines() if line.startswith("kept bytes per step")
                     for w in line.split()[-1:]), None)
        row: dict[str, Any] = {"rc": proc.returncode, "kept_bytes_per_step": kept}
        try:
            run = gpudash.load_run(run_dir)
        except gpudash.RunError as exc:
            res[keep] = {**row, "error": str(exc)}
            continue
        live = recorded_leaks(run)
        fact = run_facts(run).leak
        run.close()
        row["events"] = len(live)
        if live:
            lk = live[0]
            row.update(source=lk.source, live_per_step_bytes=lk.per_step_bytes, found_at_step=lk.last_step,
                       category=lk.category, frames=[(f.stack.split("\n")[0], f.delta_bytes)
                                                     for f in lk.frames][:3], full_at_step=lk.full_at_step)
            if kept:
                row["ratio_to_kept"] = lk.per_step_bytes / kept
        row["fact_per_step_bytes"] = fact.per_step_bytes if fact else None
        res[keep] = row
    lines = ["# the leak rule on keep_losses.py (issue 37)", "",
             table([[k, str(r.get("events", "-")), str(r.get("source", "-")), human_bytes(r["live_per_step_bytes"])
                     if r.get("live_per_step_bytes") else "-",
                     human_bytes(r["kept_bytes_per_step"]) if r.get("kept_bytes_per_step") else "-",
                     f"{r['ratio_to_kept']:.3f}" if r.get("ratio_to_kept") else "-", str(r.get("found_at_step", "-")),
                     "; ".join(f"{s} +{human_bytes(d or 0)}" for s, d in r.get("frames") or []) or "-"]
                    for k, r in res.items()],
                   ["keeps", "leak events", "source", "live growth/step", "kept/step", "ratio", "found at step",
                    "frames (snapshot diff)"])]
    (out / "leak.md").write_text("\n".join(lines) + "\n")
    return res


# ---- GPU sample runs, graph loops, live latency (issue 48) -------------------------------------------
def samples(out: Path, gpu: bool, timeout: float) -> dict[str, Any]:
    """Two small trainer runs on the GPU, for ``sample_runs/``: a healthy one (snapshots every 20 steps, device
    telemetry at 10 Hz, activations every step) and one that dies of a real CUDA OOM under ``--memory-cap-gb``
    (micro-batch 1, nothing to shrink: fp32 weights and gradients fit in 1.5 GB, Adam's state does not), with the
    allocator's snapshot at the OOM."""
    if not gpu:
        return {"skipped": "no GPU"}
    runs = [("gpu-healthy", dict(preset="small", steps=40, batch=16, effective_batch=16, snapshot_every=20,
                                 device_hz=10, activations_every=1)),
            ("gpu-oom-crash", dict(preset="gpt2-124m", steps=5, batch=1, effective_batch=1, memory_cap_gb=1.5,
                                   snapshot_every=1000))]
    res: dict[str, Any] = {}
    for name, flags in runs:
        r = train(out / "samples" / name, timeout, device="cuda", name=name, **flags)
        print(f"  {name}: rc={r['rc']} status={r.get('status')} steps={r.get('steps')} events={r.get('events')}"
              f" {r['error']}", flush=True)
        res[name] = r
    return res


def graphs(out: Path, gpu: bool) -> str:
    """``benchmarks/graph_growth.py`` on the GPU: the retained-graph and gradient-penalty loops, bare and under
    ``gpudash run``, malloc's and the CUDA allocator's growth over the late half."""
    if not gpu:
        return "skipped (no GPU)\n"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "graph_growth.py"), "--device", "cuda", "--steps", "3000",
           "--width", "1024", "--batch", "256"]
    return report(cmd, 300.0)


def report(cmd: list[str], cap: float) -> str:
    """What ``cmd`` printed (its stderr's end too when it failed), given at most ``cap`` seconds and what is left
    before the deadline; a command stopped there says so, with what it had printed."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(15.0, min(cap, left())))
    except subprocess.TimeoutExpired as exc:
        got = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else str(exc.stdout or "")
        return f"timed out\n{got[-20000:]}"
    return proc.stdout[-20000:] + (f"\n[stderr]\n{proc.stderr[-3000:]}" if proc.returncode else "")


def live(out: Path, gpu: bool, seconds: float = 8.0) -> dict[str, Any]:
    """The store's part of live latency: a Monitor trains on the device while a thread polls the run as the page
    does (``RunReader.read_since`` every 50 ms); latency = when a step's row was read back minus the step's own
    end time (``steps.time``). The browser's own poll and paint come on top (benchmarks/dashboard.py)."""
    import threading

    from gpudash.monitor import Monitor
    from gpudash.store.reader import RunReader
    from gpudash.testing import ToyLoop

    dev = "cuda" if gpu else "cpu"
    loop = ToyLoop([2048 if gpu else 128] * 4, activation=None, batch=64, labels=None, fixed_batch=True, device=dev,
                   seed=None)
    run_dir = out / "runs" / "live"
    lat: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        reader, cursor, first = None, None, True
        while not stop.is_set():
            try:
                reader = reader or RunReader(run_dir)
                new, cursor = reader.read_since(cursor, tables=("steps",))
                now = time.time()
                df = new.get("steps")
                if df is not None and len(df) and not first:
                    lat.extend((now - df["time"]).tolist())
                first = first and not (df is not None and len(df))
            except Exception:  # noqa: BLE001 - not there yet
                pass
            time.sleep(0.05)
        if reader is not None:
            reader.close()

    steps = 0
    with Monitor(run_dir, device_hz=10) as mon:
        mon.watch(loop.model, loop.opt)
        th = threading.Thread(target=poll, daemon=True)
        th.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with loop.step(mon) as s:
                mon.log(loss=s.loss)
            steps += 1
            time.sleep(0.01)
        time.sleep(3.0)  # the last flush
        stop.set()
        th.join(timeout=10)
    lat.sort()
    res: dict[str, Any] = {"steps": steps, "rows_seen": len(lat)}
    if lat:
        res.update(p50_s=lat[len(lat) // 2], p95_s=lat[int(len(lat) * 0.95)], max_s=lat[-1])
    (out / "live.md").write_text(f"# live latency, store part ({dev})\n\n" + table(
        [[str(steps), str(len(lat)), *(f"{res[k] * 1e3:.0f}" if k in res else "-" for k in ("p50_s", "p95_s", "max_s"))]],
        ["steps", "rows read back", "p50 ms", "p95 ms", "max ms"]))
    return res


def gpu_tests(out: Path, gpu: bool) -> str:
    """The test files that skip without CUDA, run where they do not: the GPU collectors, the trainer on the GPU,
    the categories. ``OUT/gpu_tests.txt``."""
    if not gpu:
        return "skipped (no GPU)\n"
    files = ["tests/collectors/test_gpu_real.py", "tests/trainer/test_gpu.py", "tests/collectors/test_categories.py",
             "tests/collectors/test_gpu_collectors_cpu.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", "--timeout", "120",
           *[f for f in files if (ROOT / f).exists()]]
    return report(cmd, 240.0)


# ---- collectors and overhead ----------------------------------------------------------------
def collectors(out: Path, gpu: bool) -> str:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "collectors.py")]
    if gpu:
        cmd += ["--fixtures", str(out / "fixtures")]
    return report(cmd, 240.0)


def overhead(out: Path, gpu: bool, steps: int) -> dict[str, float]:
    """Step time of one model bare vs under a Monitor with every collector on."""
    import torch

    from gpudash.monitor import Monitor
    from gpudash.testing import ToyLoop

    dev = "cuda" if gpu else "cpu"
    width = 4096 if gpu else 256
    loop = ToyLoop([width] * 5, activation=None, batch=64, labels=None, fixed_batch=True, device=dev, seed=None)

    def step(mon: Any) -> None:
        if mon is None:
            loop.bare_step()
            return
        with loop.step(mon) as s:
            mon.log(loss=s.loss)

    def timed(mon: Any, n: int) -> float:
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step(mon)
        if gpu:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    mon = Monitor(out / "runs" / "overhead-all-collectors", device_hz=20, stacks_hz=10, snapshot_every=0)
    mon.watch(loop.model, loop.opt)
    timed(None, 5)
    timed(mon, 5)
    bares, insts = [], []
    for _ in range(5):  # interleaved rounds: drift and neighbours hit both alike
        bares.append(timed(None, max(1, steps // 5)))
        insts.append(timed(mon, max(1, steps // 5)))
    mon.close()
    base, inst = sorted(bares)[2], sorted(insts)[2]
    return {"bare_step_ms": base * 1e3, "monitored_step_ms": inst * 1e3, "ratio": inst / base}


# ---- report -----------------------------------------------------------------------------------
def table(rows: list[list[str]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_reports(out: Path, strat: list[dict[str, Any]], card: list[dict[str, Any]]) -> None:
    rows = []
    base: dict[str, dict[str, Any]] = {}
    for r in strat:
        if r["ckpt"] == "none" and r["precision"] == "fp32" and r["offload"] == "none":
            base[r["preset"]] = r
    for r in strat:
        b = base.get(r["preset"], {})
        rel = (f"{r['step_s'] / b['step_s']:.2f}x" if r.get("step_s") and b.get("step_s") else "-")
        mem = (f"{r['measured_peak_bytes'] / b['measured_peak_bytes']:.2f}x"
               if r.get("measured_peak_bytes") and b.get("measured_peak_bytes") else "-")
        rows.append([r["preset"], r["ckpt"], r["precision"], r["offload"], human_bytes(r.get("params_bytes")),
                     human_bytes(r.get("grads_bytes")), human_bytes(r.get("optimizer_bytes")),
                     human_bytes(r.get("activations_bytes")), human_bytes(r.get("measured_peak_bytes")), mem,
                     (f"{r['step_s'] * 1e3:.1f}" + (" (shared GPU)" if r.get("shared_gpu") else ""))
                     if r.get("step_s") else r["error"] or "-", rel])
    (out / "strategies.md").write_text(table(rows, [
        "preset", "ckpt", "precision", "offload", "params", "grads", "optimizer", "activations", "peak",
        "peak vs fp32", "step ms", "step vs fp32"]))
    def pair(r: dict[str, Any], key: str) -> str:
        return f"{human_bytes(r.get('predicted_' + key))} / {human_bytes(r.get(key))}"

    est = [[r["name"], *(pair(r, f"{c}_bytes") for c in CATEGORIES), pair(r, "peak_bytes").split(" / ")[0] + " / "
            + human_bytes(r.get("measured_peak_bytes")), r.get("peak_source", "-"),
            f"{r['estimator_error_pct']:+.1f} %" if r.get("estimator_error_pct") is not None else "-",
            f"{r['estimator_step_error_pct']:+.1f} %" if r.get("estimator_step_error_pct") is not None else "-"]
           for r in strat + card]
    (out / "estimator.md").write_text(table(est, ["run", *(f"{c} predicted / measured" for c in CATEGORIES),
                                                  "peak predicted / measured", "measured by", "peak error",
                                                  "per-step error (median, steps after the first)"]))
    crow = [[f"{r['card_gb']} GB", r["preset"], r["technique"], "yes" if r["rc"] == 0 else f"no ({r['error']})",
             f"{r.get('micro_batch_max', 0):.0f}", str(r.get("ooms", 0)),
             f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"] for r in card]
    (out / "cards.md").write_text(table(crow, ["card", "model", "technique (ckpt/precision/offload)", "trains",
                                               "largest micro-batch", "OOMs recovered", "tokens/s"]))


def remeasure(out: Path, more: list[Path]) -> int:
    """Rebuild the reports of a pack brought back from the device (``OUT/summary.json`` and ``OUT/runs``) with
    this checkout's analysis; a run of the same name under ``MORE/runs`` (recorded one at a time, alone on the
    GPU) replaces the pack's."""
    summary = json.loads((out / "summary.json").read_text())
    for part in ("strategies", "cards"):
        for r in summary.get(part) or []:
            alone = next((d / "runs" / r["name"] for d in more if (d / "runs" / r["name"]).is_dir()), None)
            run_dir = alone or out / "runs" / r["name"]
            if not run_dir.is_dir():
                continue
            try:
                run = gpudash.load_run(run_dir)
            except gpudash.RunError as exc:
                r["error"] = str(exc)
                continue
            got = measure(run)
            run.close()
            if alone is not None:
                r.update(rc=0 if got.get("status") == "finished" else 1, error="", shared_gpu=False)
            r.update(got, run_dir=str(run_dir))
    write_reports(out, summary.get("strategies") or [], summary.get("cards") or [])
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"rebuilt the reports in {out}")
    return 0


def main() -> int:
    global DEADLINE, SHARED, JOBS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", type=Path, default=Path(os.environ.get("OUT", "device-check")))
    ap.add_argument("--steps", type=int, default=0, help="steps per trainer run (default: 12 on GPU, 4 on CPU)")
    ap.add_argument("--run-timeout", type=float, default=0, help="seconds per trainer run (default 90 GPU, 120 CPU)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: "
                    "collectors,overhead,micro,live,samples,leak,graphs,gpu_tests,strategies,cards")
    ap.add_argument("--jobs", type=int, default=1, help="after the timed parts, run the other parts side by side and "
                    "this many trainer runs of a part at once (memory is per process; step times are shared)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds: no part or run starts after this; "
                    "runs get only what is left (0: none)")
    ap.add_argument("--remeasure", action="store_true", help="run nothing: rebuild OUT's reports from its runs")
    ap.add_argument("--runs-from", type=Path, action="append", default=[], help="with --remeasure: runs of the "
                    "same name under DIR/runs (recorded alone on the GPU) replace the pack's")
    args = ap.parse_args()
    if args.remeasure:
        return remeasure(args.out, args.runs_from)
    if args.deadline:
        DEADLINE = time.monotonic() + args.deadline
    gpu = cuda_available()
    steps = args.steps or (12 if gpu else 4)
    timeout = args.run_timeout or (90.0 if gpu else 120.0)
    skip = set(filter(None, args.skip.split(",")))
    out: Path = args.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    summary: dict[str, Any] = {"gpu": gpu, "steps_per_run": steps, "jobs": args.jobs}
    print(f"device_check -> {out} ({'GPU' if gpu else 'CPU: GPU-only parts skipped (no GPU)'})", flush=True)
    summary["env"] = env = probe()
    (out / "env.json").write_text(json.dumps(env, indent=1, default=str))
    print(f"[{time.time() - t0:5.0f}s] env: {env.get('gpu', 'no GPU')}, NVML {env['nvml'].get('available')}, "
          f"py-spy {env['py_spy'].get('available')}", flush=True)
    if not gpu:
        summary["skipped"] = "GPU-only parts: bf16/gpt2 presets, memory caps, NVML, snapshot fixtures (no GPU)"
    parts: dict[str, list[dict[str, Any]]] = {"strategies": [], "cards": []}
    import threading

    lock = threading.Lock()

    def save(part: str) -> None:
        # after every part: a GPU slot that runs out still leaves everything done so far
        with lock:
            summary.update(strategies=parts["strategies"], cards=parts["cards"], wall_s=time.time() - t0)
            write_reports(out, parts["strategies"], parts["cards"])
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(f"[{time.time() - t0:5.0f}s] {part} done; saved {out}/summary.json", flush=True)

    def part(name: str, fn: Any) -> None:
        if name in skip:
            return
        if left() < 20:
            summary.setdefault("skipped_parts", []).append(name)
            save(f"{name} skipped (deadline)")
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one part's failure leaves the others
            summary.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        save(name)

    def collectors_part() -> None:
        (out / "collectors.txt").write_text(collectors(out, gpu))

    def micro_part() -> None:  # issue 41's microbenchmark on another machine (CPU only; peers where installed)
        (out / "micro.txt").write_text(report([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--parts", "5"],
                                              120.0))

    def overhead_part() -> None:
        summary["overhead"] = overhead(out, gpu, 50 if gpu else 20)
        with open(out / "collectors.txt", "a") as f:
            f.write(f"\nMonitor (all collectors) vs bare: {json.dumps(summary['overhead'])}\n")

    def graphs_part() -> None:
        (out / "graphs.md").write_text(graphs(out, gpu))

    def gpu_tests_part() -> None:
        (out / "gpu_tests.txt").write_text(gpu_tests(out, gpu))

    # most valuable first: the CPU test fixtures, then costs (alone on the machine: they are timings), then the
    # memory matrices, side by side with --jobs
    part("collectors", collectors_part)
    part("overhead", overhead_part)
    part("micro", micro_part)
    part("live", lambda: summary.__setitem__("live", live(out, gpu)))
    rest = [("samples", lambda: summary.__setitem__("samples", samples(out, gpu, timeout))),
            ("leak", lambda: summary.__setitem__("leak", leak(out, gpu, 180.0))),
            ("graphs", graphs_part),
            ("gpu_tests", gpu_tests_part),
            ("strategies", lambda: parts.__setitem__("strategies", strategies(out, gpu, steps, timeout, args.jobs))),
            ("cards", lambda: parts.__setitem__("cards", cards(out, gpu, steps, timeout, args.jobs)))]
    SHARED, JOBS = args.jobs > 1, max(1, args.jobs)
    if args.jobs <= 1:
        for name, fn in rest:
            part(name, fn)
    else:
        threads = [threading.Thread(target=part, args=r) for r in rest]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
