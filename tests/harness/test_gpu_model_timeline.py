"""The two-timeline GPU model on hand-built events: exact figures derived by hand, to the
nanosecond; monotonicity; the targets table. Pure: no torch dispatch, no simulated device."""

from __future__ import annotations

import random

import pytest

from perf.instruments.gpu_targets import (
    DEFAULT_TARGET,
    TARGETS,
    GpuTarget,
    add_target,
    get_target,
)
from perf.instruments.gpu_timeline import OpEvent, simulate

H100 = get_target("H100 SXM")
NS = 1e-9
HOST = H100.host_op_s
MIN_K = H100.min_kernel_s
EFF = H100.efficiency


def _matmul(m: int, n: int, k: int, peak: str, itemsize: int, site: str = "a.py:1") -> OpEvent:
    return OpEvent(
        "kernel",
        "mm",
        site,
        dtype=peak,
        flops=2 * m * n * k,
        nbytes=(m * k + k * n + m * n) * itemsize,
        peak=peak,
    )


def _tiny(site: str = "a.py:2") -> OpEvent:
    return OpEvent("kernel", "add", site, dtype="fp32", nbytes=12)


@pytest.mark.parametrize(
    ("peak", "itemsize", "tflops"),
    [
        ("fp32", 4, H100.fp32_tflops),
        ("tf32", 4, H100.tf32_tflops),
        ("bf16", 2, H100.bf16_tflops),
        ("fp16", 2, H100.fp16_tflops),
    ],
)
def test_one_large_matmul_is_2mnk_over_the_peak_of_its_dtype(
    peak: str, itemsize: int, tflops: float
) -> None:
    m = n = k = 8192
    r = simulate([_matmul(m, n, k, peak, itemsize)], H100)
    eff = EFF.cuda_core if peak == "fp32" else EFF.tensor_core
    kernel_s = 2 * m * n * k / (tflops * 1e12 * eff)
    assert abs(r.total_s - (HOST + kernel_s)) < NS
    assert abs(r.device_busy_s - kernel_s) < NS
    assert r.launches == 1 and r.bound == "compute" and r.host_s == HOST
    assert r.by_site["a.py:1"].bound == "compute" and r.by_site["a.py:1"].op == f"mm {peak}"


def test_bf16_on_a_gpu_without_bf16_tensor_cores_runs_at_the_cuda_core_peak() -> None:
    t4 = get_target("T4")
    r = simulate([_matmul(4096, 4096, 4096, "bf16", 2)], t4)
    kernel_s = 2 * 4096**3 / (t4.fp32_tflops * 1e12 * t4.efficiency.cuda_core)
    assert abs(r.total_s - (t4.host_op_s + kernel_s)) < NS


def test_a_chain_of_n_tiny_ops_is_n_launches_and_host_bound() -> None:
    n = 40
    r = simulate([_tiny() for _ in range(n)], H100)
    # the host issues one every HOST; each lasts MIN_K < HOST: the last ends MIN_K after it
    assert abs(r.total_s - (n * HOST + MIN_K)) < NS
    assert r.launches == n and r.bound == "launch"
    assert abs(r.device_busy_s - n * MIN_K) < NS
    assert abs(r.device_idle_s - (n * HOST + MIN_K - n * MIN_K)) < NS
    assert r.sync_wait_s == 0.0


def test_a_memory_bound_kernel_lasts_its_bytes_over_the_bandwidth() -> None:
    nbytes = 3 * 2**28  # an elementwise op: two inputs and an output of 256 MiB each
    ev = OpEvent("kernel", "add", "a.py:3", dtype="fp32", flops=0, nbytes=nbytes)
    r = simulate([ev], H100)
    mem_s = nbytes / (H100.memory_gbps * 1e9 * EFF.memory)
    assert abs(r.total_s - (HOST + mem_s)) < NS and r.bound == "memory"


def test_a_sync_in_the_middle_drains_the_queue() -> None:
    big = _matmul(8192, 8192, 8192, "bf16", 2)
    d = 2 * 8192**3 / (H100.bf16_tflops * 1e12 * EFF.tensor_core)
    events = [big, OpEvent("sync", "item", "a.py:9"), _tiny()]
    r = simulate(events, H100)
    # host: launch (HOST), waits until the matmul ends (HOST + d), launches the tiny op
    assert abs(r.sync_wait_s - d) < NS
    assert abs(r.total_s - (HOST + d + HOST + MIN_K)) < NS
    assert r.by_site["a.py:9"].bound == "sync"
    assert abs(r.by_site["a.py:9"].time_s - d) < NS
    # without the sync the tiny op queues behind the matmul: the host never waits
    free = simulate([big, _tiny()], H100)
    assert free.sync_wait_s == 0.0
    assert abs(free.total_s - (HOST + d + MIN_K)) < NS
    assert r.total_s - free.total_s == pytest.approx(HOST, abs=NS)


def test_a_pinned_non_blocking_copy_hides_behind_compute_a_pageable_one_does_not() -> None:
    big = _matmul(8192, 8192, 8192, "bf16", 2)
    d = 2 * 8192**3 / (H100.bf16_tflops * 1e12 * EFF.tensor_core)
    nbytes = 64 * 2**20
    pinned = OpEvent(
        "copy", "_to_copy", "a.py:5", nbytes=nbytes, direction="h2d", pinned=True,
        non_blocking=True, writes=7,
    )  # fmt: skip
    use = _tiny()._replace(reads=(7,))
    c_pin = nbytes / (H100.host_link_gbps * 1e9 * EFF.pinned)
    assert c_pin < d  # the copy is shorter than the matmul it hides behind
    r = simulate([big, pinned, use], H100)
    # matmul HOST..HOST+d; copy from 2 HOST on the copy engine; the reader starts at HOST+d
    assert abs(r.total_s - (HOST + d + MIN_K)) < NS
    assert r.sync_wait_s == 0.0 and abs(r.transfer_s - c_pin) < NS
    pageable = pinned._replace(pinned=False, non_blocking=False, writes=None)
    c_page = nbytes / (H100.host_link_gbps * 1e9 * EFF.pageable)
    p = simulate([big, pageable, use], H100)
    # the host waits for the matmul, copies, then launches the reader
    assert abs(p.sync_wait_s - (HOST + d - 2 * HOST)) < NS
    assert abs(p.total_s - (HOST + d + c_page + HOST + MIN_K)) < NS
    assert p.by_site["a.py:5"].bound == "transfer"


def test_a_reader_waits_for_the_async_copy_that_fills_its_input() -> None:
    nbytes = 256 * 2**20
    copy = OpEvent(
        "copy", "copy_", "a.py:5", nbytes=nbytes, direction="h2d", pinned=True,
        non_blocking=True, writes=1,
    )  # fmt: skip
    c = nbytes / (H100.host_link_gbps * 1e9 * EFF.pinned)
    r = simulate([copy, _tiny()._replace(reads=(1,))], H100)
    assert abs(r.total_s - (HOST + c + MIN_K)) < NS
    unrelated = simulate([copy, _tiny()], H100)  # reads nothing the copy writes
    assert abs(unrelated.total_s - (HOST + c)) < NS  # the copy engine ends last


def test_ring_all_reduce_and_a_graph_replay_is_one_launch() -> None:
    nbytes, n = 400 * 2**20, 8
    ar = OpEvent("collective", "allreduce_", "a.py:7", nbytes=nbytes, world_size=n)
    r = simulate([ar], H100)
    ring = 2 * (n - 1) / n * nbytes / (H100.interconnect_gbps * 1e9 * EFF.interconnect)
    assert abs(r.total_s - (HOST + ring)) < NS and r.bound == "transfer"
    kernels = tuple(_tiny() for _ in range(20))
    g = simulate([OpEvent("graph", "graph_replay", "a.py:8", kernels=kernels)], H100)
    eager = simulate(list(kernels), H100)
    assert g.launches == 1 and eager.launches == 20
    assert abs(g.total_s - (HOST + 20 * MIN_K)) < NS
    assert g.total_s < eager.total_s


def test_blocking_device_to_host_copy_waits_then_transfers() -> None:
    big = _matmul(4096, 4096, 4096, "fp32", 4)
    d = 2 * 4096**3 / (H100.fp32_tflops * 1e12 * EFF.cuda_core)
    out = OpEvent("copy", "_to_copy", "a.py:4", nbytes=2**26, direction="d2h")
    c = 2**26 / (H100.host_link_gbps * 1e9 * EFF.pageable)
    r = simulate([big, out], H100)
    assert abs(r.sync_wait_s - (d - HOST)) < NS
    assert abs(r.total_s - (HOST + d + c)) < NS


def _random_events(rng: random.Random, n: int) -> list[OpEvent]:
    evs: list[OpEvent] = []
    for _ in range(n):
        kind = rng.choice(["kernel", "kernel", "kernel", "copy", "sync", "host", "collective"])
        site = f"x.py:{rng.randint(1, 5)}"
        if kind == "kernel":
            evs.append(
                OpEvent(
                    "kernel", "op", site, flops=rng.choice([0, 10**6, 10**9, 10**12]),
                    nbytes=rng.choice([0, 10**3, 10**7, 10**9]),
                    peak=rng.choice(["fp32", "bf16", "tf32"]), reads=(rng.randint(0, 3),),
                )
            )  # fmt: skip
        elif kind == "copy":
            pinned = rng.random() < 0.5
            evs.append(
                OpEvent(
                    "copy", "cp", site, nbytes=rng.choice([4, 10**6, 10**8]),
                    direction=rng.choice(["h2d", "d2h"]), pinned=pinned,
                    non_blocking=pinned and rng.random() < 0.7, writes=rng.randint(0, 3),
                )
            )  # fmt: skip
        elif kind == "collective":
            evs.append(OpEvent("collective", "ar", site, nbytes=10**7, world_size=4))
        else:
            evs.append(OpEvent(kind, kind, site))  # type: ignore[arg-type]
    return evs


@pytest.mark.parametrize("seed", range(40))
def test_more_work_never_models_faster(seed: int) -> None:
    rng = random.Random(seed)
    evs = _random_events(rng, rng.randint(1, 30))
    base = simulate(evs, H100).total_s
    extra = _random_events(rng, 1)[0]
    at = rng.randint(0, len(evs))
    assert simulate([*evs[:at], extra, *evs[at:]], H100).total_s >= base
    i = rng.randrange(len(evs))
    heavier = evs[i]._replace(flops=evs[i].flops * 2 + 1, nbytes=evs[i].nbytes * 2 + 1)
    assert simulate([*evs[:i], heavier, *evs[i + 1 :]], H100).total_s >= base


def test_the_same_events_model_to_identical_figures() -> None:
    evs = _random_events(random.Random(1), 200)
    assert simulate(evs, H100) == simulate(list(evs), H100)


def test_every_target_cites_its_datasheet_and_unknown_targets_list_the_known() -> None:
    assert DEFAULT_TARGET == "H100 SXM"
    for name in ("H100 SXM", "H100 PCIe", "H200", "A100", "L40S", "L4", "A10", "T4"):
        t = TARGETS[name]
        assert "datasheet" in t.source and any(
            y in t.source for y in ("2019", "2021", "2023", "2024")
        )
        assert t.memory_gbps > 0 and t.host_link_gbps > 0
    with pytest.raises(ValueError, match=r"unknown GPU target 'B300'.*'H100 SXM'.*'T4'"):
        get_target("B300")


def test_a_user_adds_a_target() -> None:
    mine = GpuTarget(
        "test-gpu", 10.0, 20.0, 40.0, 40.0, 1000.0, 25.0, "PCIe Gen4 x16", 25.0, "my datasheet"
    )
    try:
        add_target(mine)
        assert get_target("test-gpu") is mine
        with pytest.raises(ValueError, match="already known"):
            add_target(mine)
        r = simulate([_matmul(4096, 4096, 4096, "bf16", 2)], get_target("test-gpu"))
        assert abs(r.total_s - (HOST + 2 * 4096**3 / (40e12 * EFF.tensor_core))) < NS
    finally:
        TARGETS.pop("test-gpu", None)
    with pytest.raises(ValueError, match="memory_gbps must be a positive number"):
        GpuTarget("bad", 1.0, None, None, None, 0.0, 1.0, "PCIe", 1.0, "x")
