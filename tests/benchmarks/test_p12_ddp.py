"""P12: data parallel. Real DDP, two processes launched with ``torch.multiprocessing.spawn``
(gloo on CPU; nccl on 2+ GPUs; on a CPU-only box also on ``sim:0``/``sim:1`` over the simulated
device's backend). All-reduces are counted by a DDP communication hook wrapping DDP's own
all-reduce hook, so the count is what DDP actually sent."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from suite_support import free_port
from torch.nn import functional as F

import perf
from perf.core import stats
from perf.workloads.data import synthetic_classification
from perf.workloads.distributed import ddp_facts, ddp_facts_each
from perf.workloads.models import mlp

WORLD = 2
K = 4  # accumulation steps for the no_sync() facts

#: One spawn serves the module: with `--dist loadgroup` its tests share a worker.
pytestmark = pytest.mark.xdist_group("ddp")


def _spawn(tmp: Path, backend: str, timed_steps: int = 0) -> list[dict[str, Any]]:
    """Run both ranks once and return each rank's facts (one spawn serves several tests)."""
    _spawn_retrying(lambda: (ddp_facts, (WORLD, free_port(), str(tmp), backend, K, timed_steps)))
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _spawn_retrying(target: Callable[[], tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
    last: Exception | None = None
    for _ in range(3):  # a port taken between probing and binding: retry with another
        fn, args = target()
        try:
            mp.spawn(fn, args=args, nprocs=WORLD, join=True)
            return
        except mp.ProcessRaisedException as e:
            if "address already in use" not in str(e).lower():
                raise
            last = e
    raise RuntimeError("no free rendezvous port after 3 tries") from last


def _sim_unavailable() -> str | None:
    from perf.sim.device import unavailable_reason

    reason = unavailable_reason(allow_with_accelerator=True)
    return None if reason is None else f"needs the simulated device: {reason}"


@pytest.fixture(scope="module")
def cpu_facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]] | str]:
    """The run over gloo on CPU tensors and the same run on ``sim:rank`` (each rank installs two
    sim devices after its gloo run), from one spawn: for each backend its ranks' facts, or
    why it cannot run here."""
    if not dist.is_available() or not dist.is_gloo_available():
        why = "needs torch.distributed with the gloo backend (sim's backend rides it)"
        return {"gloo": why, "sim": why}
    out: dict[str, list[dict[str, Any]] | str] = {}
    sim_why = _sim_unavailable()
    backends = ["gloo"] if sim_why else ["gloo", "sim"]
    if sim_why:
        out["sim"] = sim_why
    tmp = tmp_path_factory.mktemp("ddp")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if "sim" in backends:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # sim refuses a process with CUDA; gloo is CPU
    try:
        _spawn_retrying(
            lambda: (
                ddp_facts_each,
                (WORLD, [free_port() for _ in backends], str(tmp), backends, K),
            )
        )
    finally:
        if hidden is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    for b in backends:
        out[b] = [json.loads((tmp / b / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return out


def _facts(cpu_facts: dict[str, list[dict[str, Any]] | str], backend: str) -> list[dict[str, Any]]:
    got = cpu_facts[backend]
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.fixture(scope="module")
def sim_facts(cpu_facts: dict[str, list[dict[str, Any]] | str]) -> list[dict[str, Any]]:
    return _facts(cpu_facts, "sim")


@pytest.fixture(scope="module")
def gloo_facts(cpu_facts: dict[str, list[dict[str, Any]] | str]) -> list[dict[str, Any]]:
    return _facts(cpu_facts, "gloo")


def test_ddp_gloo_gradients_equal_full_batch_gradient(
    gloo_facts: list[dict[str, Any]], perf_metrics
) -> None:
    """Each rank sees half the batch; after DDP's averaging all-reduce, its gradient equals the
    gradient of the whole batch on one process (float64, atol 1e-12), on both ranks."""
    err = max(f["grad_max_abs_err"] for f in gloo_facts)
    perf_metrics.record("grad_max_abs_err", err, "1")
    assert err <= 1e-12 * max(1.0, gloo_facts[0]["grad_max_abs"]), gloo_facts
    assert gloo_facts[0]["grad_checksum"] == gloo_facts[1]["grad_checksum"]


def test_ddp_gloo_allreduce_bytes_equal_gradient_bytes(
    gloo_facts: list[dict[str, Any]], perf_metrics
) -> None:
    """One synced step all-reduces every gradient exactly once: bytes == parameter bytes."""
    f = gloo_facts[0]
    perf_metrics.record("allreduce_calls_per_step", f["step_allreduce_calls"], "calls")
    perf_metrics.record("allreduce_bytes_per_step", f["step_allreduce_bytes"], "bytes")
    perf_metrics.record("param_bytes", f["param_bytes"], "bytes")
    assert f["step_allreduce_calls"] >= 1
    for r in gloo_facts:
        assert r["step_allreduce_bytes"] == r["param_bytes"], r


def test_ddp_gloo_no_sync_cuts_allreduces_k_fold(
    gloo_facts: list[dict[str, Any]], perf_metrics
) -> None:
    """k accumulation micro-steps: syncing each one costs k all-reduce rounds; ``no_sync()`` on
    all but the last costs one round, with the same (full-batch) gradient."""
    f = gloo_facts[0]
    perf_metrics.record("allreduce_calls_sync_every_step", f["sync_every_step_calls"], "calls")
    perf_metrics.record("allreduce_calls_no_sync", f["no_sync_calls"], "calls")
    perf_metrics.record("allreduce_bytes_no_sync", f["no_sync_bytes"], "bytes")
    perf_metrics.record("no_sync_grad_max_abs_err", f["no_sync_grad_max_abs_err"], "1")
    assert f["sync_every_step_calls"] == K * f["no_sync_calls"], f
    assert f["sync_every_step_bytes"] == K * f["no_sync_bytes"] == K * f["param_bytes"], f
    assert max(r["no_sync_grad_max_abs_err"] for r in gloo_facts) <= 1e-12, gloo_facts


def test_ddp_sim_gradients_counts_and_no_sync(
    sim_facts: list[dict[str, Any]], gloo_facts: list[dict[str, Any]], perf_metrics
) -> None:
    """On ``sim:0``/``sim:1``: the P12 facts hold as on CPU (same float64 kernels, so the
    same gradients bit for bit), and the sim backend's own all-reduce count equals what DDP
    sent (the hook's count): calls and bytes, as NCCL would get them."""
    f = sim_facts[0]
    perf_metrics.record("allreduce_calls_per_step", f["backend_allreduce_calls"], "calls")
    perf_metrics.record("allreduce_bytes_per_step", f["backend_allreduce_bytes"], "bytes")
    for r in sim_facts:
        assert r["step_allreduce_bytes"] == r["param_bytes"], r
        assert (r["backend_allreduce_calls"], r["backend_allreduce_bytes"]) == (
            r["step_allreduce_calls"], r["step_allreduce_bytes"]), r  # fmt: skip
        assert r["sync_every_step_calls"] == K * r["no_sync_calls"], r
        assert r["no_sync_grad_max_abs_err"] <= 1e-12, r
        assert r["grad_max_abs_err"] <= 1e-12 * max(1.0, r["grad_max_abs"]), r
    assert [r["grad_checksum"] for r in sim_facts] == [r["grad_checksum"] for r in gloo_facts]


def test_dataparallel_moves_the_model_every_step_ddp_only_its_gradients(
    sim_facts: list[dict[str, Any]], perf_metrics
) -> None:
    """The source notes: DataParallel is simple but inefficient, DDP the production choice.
    Counted on ``sim:0``/``sim:1`` (one DataParallel step on the whole batch, in rank 0's
    process): DataParallel broadcasts the parameters to every other device and reduces their
    gradients back, all through device 0, so it moves at least 2 x (N - 1) x the parameter
    bytes a step (plus the batch), where DDP all-reduces the gradients' bytes once. The
    gradient is the full-batch gradient either way."""
    f = sim_facts[0]
    dp_bytes, ddp_bytes = f["dp_step_d2d_bytes"], f["step_allreduce_bytes"]
    perf_metrics.record("dataparallel_d2d_bytes_per_step", dp_bytes, "bytes")
    perf_metrics.record("dataparallel_over_ddp_bytes", dp_bytes / ddp_bytes, "ratio")
    assert ddp_bytes == f["param_bytes"]
    assert dp_bytes >= 2 * (WORLD - 1) * f["param_bytes"], f
    assert f["dp_step_host_copies"] == 0, f
    assert f["dp_grad_max_abs_err"] <= 1e-12 * max(1.0, f["grad_max_abs"]), f


@pytest.mark.perf_cuda(min_devices=2)
def test_ddp_nccl_allreduce_counts_and_gradients(tmp_path: Path, perf_metrics) -> None:
    """The same facts over nccl on two GPUs (float32, so a float32 tolerance)."""
    if not dist.is_nccl_available():
        pytest.skip("needs CUDA with the nccl backend (torch.distributed.is_nccl_available())")
    facts = _spawn(tmp_path, "nccl")
    f = facts[0]
    perf_metrics.record("allreduce_bytes_per_step", f["step_allreduce_bytes"], "bytes")
    perf_metrics.record("allreduce_calls_no_sync", f["no_sync_calls"], "calls")
    perf_metrics.record("grad_max_abs_err", f["grad_max_abs_err"], "1")
    assert f["step_allreduce_bytes"] == f["param_bytes"]
    assert f["sync_every_step_calls"] == K * f["no_sync_calls"]
    assert f["grad_max_abs_err"] <= 1e-5 * max(1.0, f["grad_max_abs"])


@pytest.mark.perf_cuda(min_devices=2)
@pytest.mark.perf_timing
def test_ddp_faster_than_dataparallel(tmp_path: Path, perf_metrics) -> None:
    """DataParallel (one process, replicates the model every step, GIL-bound) versus DDP (one
    process per GPU). Step times come from two launches, so the samples are unpaired: the
    interval is a bootstrap of the ratio of medians; DDP must not be slower with confidence."""
    facts = _spawn(tmp_path, "nccl", timed_steps=30)
    ddp_samples = facts[0]["step_time_samples_s"]
    dp = torch.nn.DataParallel(mlp(32, 64, 2, 5, seed=0).cuda(0), device_ids=[0, 1])
    opt = torch.optim.SGD(dp.parameters(), lr=1e-3)
    x, y = synthetic_classification(WORLD * 16, 32, 5, seed=1, device="cuda:0")

    def dp_step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(dp(x), y).backward()
        opt.step()

    dp_t = perf.measure(dp_step, device="cuda:0", number=1, samples=30)
    lo, hi = stats.ratio_of_medians_ci(dp_t.samples_s, ddp_samples)
    ratio = stats.median(dp_t.samples_s) / stats.median(ddp_samples)
    perf_metrics.record("dataparallel_over_ddp_step_time", ratio, "ratio", ci_low=lo, ci_high=hi)
    assert hi > 1.0, f"DataParallel faster than DDP: {ratio:.2f} [{lo:.2f}, {hi:.2f}]"
