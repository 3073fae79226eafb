"""``sim``'s per-op path in C++ (``perf.sim.native``) against its Python path.

Each side runs in a child process (the path is chosen when ``sim`` is installed): the same
programs must give the same values, counts and memory figures both ways; the C++ path must take
the common ops and leave the ones with a rule to Python; a failed build says what to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perf.sim import native

ROOT = Path(__file__).resolve().parents[2]

#: one program touching each kind of op the C++ path takes or hands on: pointwise, in place,
#: out= that resizes, views, factories with device=, an RNN, a training step with AdamW, a sync,
#: an error, the memory model's figures and snapshot
PROGRAM = textwrap.dedent(
    """
    import json, sys, torch, perf
    from perf.sim import memory, tensors
    dev = perf.simulated_device()
    out = {"native": tensors.native is not None}
    torch.manual_seed(0)
    a = torch.randn(16, 16, device=dev)
    b = torch.randn(16, 16, device=dev)
    c = a + b
    c.add_(a).mul_(0.5)
    d = torch.empty(0, device=dev)
    torch.mm(a, b, out=d)  # out= that resizes
    v = c.t()[2:5]
    z = torch.zeros(3, 4, device=dev, dtype=torch.float64)
    r = torch.arange(10, device=dev).view(2, 5).sum(1)
    x = torch.randn(8, 20, 4, device=dev)
    mask = x[..., 0] > 0
    sel = x[mask]
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.to(dev)
    lstm = torch.nn.LSTM(4, 8).to(dev)
    opt = torch.optim.AdamW([*model.parameters(), *lstm.parameters()], lr=1e-2)
    losses = []
    with perf.count_syncs() as syncs, perf.count_ops() as ops:
        for step in range(3):
            h, _ = lstm(x)
            loss = model(h).pow(2).mean() + sel.abs().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step == 2:
                losses.append(loss.item())
    try:
        a @ torch.randn(3, 5, device=dev)
    except RuntimeError as e:
        out["error"] = str(e)
    out["values"] = [c.sum().item(), d.sum().item(), v.sum().item(), z.sum().item(),
                     r.tolist(), sel.shape[0], losses]
    out["syncs"] = syncs.count
    out["ops"] = ops.count
    out["memory_stats"] = dict(torch.sim.memory_stats())
    snap = memory.allocator().snapshot()
    out["segments"] = [(s["total_size"], len(s["blocks"])) for s in snap["segments"]]
    del a, b, c, d, v, z, model, lstm, opt, x, sel, h, loss
    out["after_free"] = torch.sim.memory_allocated()
    if tensors.native is not None:
        fast, python = tensors.native.counts()
        out["fast_share"] = fast / (fast + python)
    json.dump(out, sys.stdout)
    """
)


def _run(code: str, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, CUDA_VISIBLE_DEVICES="", **{native.ENV: mode}, **env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=full,
    )  # fmt: skip


def _native_or_skip() -> None:
    try:
        native.load()
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ path does not build here: {e}")


def test_the_c_path_gives_the_python_paths_values_counts_and_memory_figures() -> None:
    _native_or_skip()
    py = _run(PROGRAM, "0")
    cc = _run(PROGRAM, "1")
    assert py.returncode == 0, py.stderr
    assert cc.returncode == 0, cc.stderr
    slow, fast = json.loads(py.stdout), json.loads(cc.stdout)
    assert (slow.pop("native"), fast.pop("native")) == (False, True)
    share = fast.pop("fast_share")
    assert slow == fast
    # the error still goes through Python, which names sim and the op
    assert "[perf sim]" in fast["error"] and "aten.mm.default" in fast["error"]
    assert fast["memory_stats"]["num_alloc_retries"] == 0
    assert fast["memory_stats"]["allocation.all.allocated"] > 100
    # most ops take the C++ path (the rest: copies, the mask's nonzero, AdamW's item-free
    # rules, the error)
    assert share > 0.7, share


TWO_DEVICES = textwrap.dedent(
    """
    import json, sys, threading, torch, perf
    from perf.sim import tensors
    perf.simulated_device()
    out = {}
    torch.manual_seed(0)
    a = torch.randn(8, 8, device="sim:1")
    b = (a @ a).relu().sum(0)
    torch.sim.set_device(1)
    c = torch.zeros(3, device="sim") + 1  # no index: the current device
    seen = []
    t = threading.Thread(target=lambda: seen.append(str(torch.ones(1, device="sim").device)))
    t.start(); t.join()  # a new thread starts on device 0, as on CUDA
    d = c.to("sim:0") * 2  # a device-to-device copy
    errors = []
    mixed = lambda: a + torch.ones(8, 8, device="sim:0")
    past = lambda: torch.ones(1, device="sim:7")
    for bad in (mixed, past):
        try:
            bad()
        except Exception as e:
            errors.append(type(e).__name__)
    out["devices"] = [str(x.device) for x in (a, b, c, d)] + seen
    out["values"] = [b.sum().item(), c.sum().item(), d.sum().item()]
    out["errors"] = errors
    out["allocated"] = [torch.sim.memory_allocated(i) for i in range(2)]
    if tensors.native is not None:
        out["fast"] = tensors.native.counts()[0] > 0
    json.dump(out, sys.stdout)
    """
)


def test_several_devices_give_the_python_paths_devices_values_and_errors() -> None:
    _native_or_skip()
    py, cc = (_run(TWO_DEVICES, mode, PERF_SIM_DEVICES="2") for mode in ("0", "1"))
    assert py.returncode == 0, py.stderr
    assert cc.returncode == 0, cc.stderr
    slow, fast = json.loads(py.stdout), json.loads(cc.stdout)
    assert fast.pop("fast") is True
    assert slow == fast
    assert fast["devices"] == ["sim:1", "sim:1", "sim:1", "sim:0", "sim:0"]
    # mixed devices, and an index past the count (torch's AcceleratorError where it has one)
    assert len(fast["errors"]) == 2 and fast["errors"][0] == "RuntimeError"


def test_an_out_of_memory_error_belongs_to_the_op_that_allocates() -> None:
    """With a capacity the model replays at each allocation, so the op that does not fit
    raises CUDA's error, and the program can go on after it."""
    _native_or_skip()
    code = textwrap.dedent(
        """
        import torch, perf
        from perf.sim import memory
        from perf.sim.allocator import AllocatorOutOfMemoryError
        dev = perf.simulated_device()
        memory.configure(memory.MemoryModelConfig(capacity_bytes=64 << 20), forget_live=True)
        keep = [torch.empty(8 << 20, dtype=torch.uint8, device=dev) for _ in range(6)]
        try:
            keep.append(torch.ones(32 << 20, dtype=torch.uint8, device=dev) * 2)
        except AllocatorOutOfMemoryError as e:
            print("oom", len(keep), "CUDA out of memory" in str(e) or str(e)[:80])
        del keep
        print("after", torch.sim.memory_allocated())
        y = torch.ones(4 << 20, dtype=torch.uint8, device=dev)
        print("fits", torch.sim.memory_allocated())
        """
    )
    results = [_run(code, mode) for mode in ("0", "1")]
    for proc in results:
        assert proc.returncode == 0, proc.stderr
    assert results[0].stdout == results[1].stdout
    assert results[1].stdout.startswith("oom 6 ")


def test_a_program_that_never_reads_the_model_keeps_a_bounded_log() -> None:
    """The log replays by itself once it holds ``max_log()`` events, so a long run that never
    asks for a memory figure does not grow it without end; the figures stay exact."""
    _native_or_skip()
    code = textwrap.dedent(
        """
        import torch, perf
        from perf.sim import tensors
        dev = perf.simulated_device()
        nat = tensors.native
        x = torch.ones(4, device=dev)
        torch.sim.memory_allocated()  # replayed: the log is empty
        sizes = []
        for i in range(nat.max_log()):  # an allocation and a free each
            y = x + 1
            sizes.append(nat.log_size())
        del y
        dropped = any(b < a for a, b in zip(sizes, sizes[1:]))  # replayed, unasked
        print(max(sizes) <= nat.max_log(), dropped)
        print(torch.sim.memory_stats()["allocation.all.allocated"])
        """
    )
    proc = _run(code, "1")
    assert proc.returncode == 0, proc.stderr
    bounded, allocations = proc.stdout.split("\n")[:2]
    assert bounded == "True True"
    assert int(allocations) == 1 + 65536  # x, then one y per step: none lost to the replays


def test_a_failed_build_says_what_to_do(tmp_path: Path) -> None:
    """No compiler: PERF_SIM_NATIVE=1 refuses with the reason and the way out; the default
    (auto) warns once and runs the Python path."""
    code = textwrap.dedent(
        """
        import warnings, torch, perf
        from perf.sim import tensors
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dev = perf.simulated_device()
        print([w.category.__name__ for w in caught], tensors.native is None)
        print((torch.ones(3, device=dev) * 2).sum().item())
        """
    )
    no_compiler = {"CXX": "/nonexistent/c++", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    on = _run(code, "1", **no_compiler)
    assert on.returncode != 0
    assert "could not build its C++ path" in on.stderr
    assert f"{native.ENV}=0 runs the Python path" in on.stderr
    auto = _run(code, "auto", **no_compiler)
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.split("\n")[:2] == ["['NativeBuildWarning'] True", "6.0"]


def test_the_environment_variable_takes_clear_values() -> None:
    assert native.mode({}) == "auto"
    assert native.mode({native.ENV: "1"}) == "on"
    assert native.mode({native.ENV: " off "}) == "off"
    assert native.mode({native.ENV: "AUTO"}) == "auto"
    with pytest.raises(ValueError, match="PERF_SIM_NATIVE='maybe'"):
        native.mode({native.ENV: "maybe"})


#: the Python path's own run: the files that exercise most of what the C++ path hands back
#: (copies, syncs by rule, views, the memory model, training patterns)
PYTHON_PATH_FILES = (
    "tests/harness/test_simulated.py",
    "tests/harness/test_memory_sim.py",
    "tests/harness/test_sim_sync_cases.py",
    "tests/harness/test_sim_training_patterns.py",
)


def test_the_python_path_still_passes_the_core_sim_tests() -> None:
    """The suite runs ``sim``'s C++ path wherever it builds; the Python path (no compiler,
    ``PERF_SIM_NATIVE=0``) keeps its own run of the core files, in one child process."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*cmd, *PYTHON_PATH_FILES], cwd=ROOT, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **{native.ENV: "0"}),
    )  # fmt: skip
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail


def test_each_source_builds_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two checkouts of perf with different C++ sources (a gate's base and head) never share a
    build: a process that waited for the other's build would load it."""
    ours = native.build_name()
    other = tmp_path / "sim_native.cpp"
    other.write_bytes(native.SOURCE.read_bytes() + b"\n// another version\n")
    monkeypatch.setattr(native, "SOURCE", other)
    assert native.build_name() != ours
    other.write_bytes(native.SOURCE.read_bytes()[: -len(b"\n// another version\n")])
    assert native.build_name() == ours
