"""P1: the GPU beats the CPU only above a size threshold. Small work (the Iris full-batch
training step, 120x4 -> 3 classes) is faster on the CPU — kernel launches and host-device
round trips cost more than the arithmetic; large matmuls are far faster on the GPU. The
crossover size is found with confidence and recorded. The measured tests are CUDA only (they
compare CPU with GPU); on CPU-only CI the *predicted* crossover compares the modelled GPU time
of ``--perf-gpu-target`` (``perf.model_gpu_time`` on ``sim``) with the measured CPU time.

Whether the Iris step with each device's *default* optimizer is faster on the CPU depends on
the hardware (both sides are near 300 us): that ratio is recorded, not asserted; the seeds'
mechanism (per-kernel launch overhead) is asserted with the same op sequence on both sides."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch
from suite_support import cpu_slower_than_modelled, require

import perf
from perf.core.stats import crossover
from perf.instruments.health import matmul_fp32_precision
from perf.workloads.data import iris_split, synthetic_classification
from perf.workloads.loops import make_train_step
from perf.workloads.models import mlp

MATMUL_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
WIDTHS = (16, 64, 256, 1024, 2048)


def _free(device: torch.device) -> None:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _sweep(
    sizes: tuple[int, ...],
    build: Callable[[int, torch.device], Callable[[], object]],
    device: torch.device,
    perf_metrics,
    prefix: str,
) -> tuple[list[int], list[bool], dict[int, perf.Comparison]]:
    """CPU-time / GPU-time per size; a size that runs out of GPU memory is skipped, its
    memory freed, and the reason recorded."""
    done: list[int] = []
    wins: list[bool] = []
    cmps: dict[int, perf.Comparison] = {}
    for n in sizes:
        try:
            fn_cpu, fn_gpu = build(n, torch.device("cpu")), build(n, device)
            cmp = perf.compare(
                fn_cpu,
                fn_gpu,
                device_a="cpu",
                device_b=device,
                pairs=8,
                labels=(f"cpu_{n}", f"{device}_{n}"),
            )
        except torch.OutOfMemoryError as e:
            _free(device)
            perf_metrics.record(
                f"{prefix}_skipped_{n}",
                1,
                "count",
                reason=f"out of GPU memory at size {n}: {str(e)[:200]}",
            )
            continue
        done.append(n)
        wins.append(cmp.a_slower(1.0))  # CPU slower with confidence -> the GPU wins
        cmps[n] = cmp
        perf_metrics.record(f"{prefix}_cpu_over_gpu_{n}", cmp, "ratio", higher_is_better=True)
        del fn_cpu, fn_gpu
        _free(device)
    return done, wins, cmps


def _matmul(n: int, device: torch.device) -> Callable[[], object]:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return lambda: a @ b


def _train_step(width: int, device: torch.device) -> Callable[[], object]:
    x, y = synthetic_classification(1024, 256, 10, device=device)
    model = mlp(256, width, 2, 10).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return make_train_step(model, opt, x, y)


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_crossover_matmul_gpu_beats_cpu_above_size(device: torch.device, perf_metrics) -> None:
    """Square fp32 matmuls 64..4096: a crossover exists, and at the largest size the GPU is at
    least 5x faster with 95% confidence."""
    with matmul_fp32_precision("ieee"):  # full fp32 on both sides; restored afterwards
        sizes, wins, cmps = _sweep(MATMUL_SIZES, _matmul, device, perf_metrics, "matmul")
    assert sizes, "every size ran out of GPU memory"
    cross = crossover(sizes, wins)
    perf_metrics.record("matmul_crossover_size", cross if cross is not None else -1, "elements")
    require(cmps[sizes[-1]].decide_a_slower(5.0))
    # the largest size won with confidence, so a crossover exists
    assert cross is not None, f"the GPU never won: {[str(c) for c in cmps.values()]}"


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_crossover_training_step_width_sweep(device: torch.device, perf_metrics) -> None:
    """MLP training step (batch 1024, Adam) of growing width: a crossover width exists and the
    GPU wins at the widest model with confidence."""
    sizes, wins, cmps = _sweep(WIDTHS, _train_step, device, perf_metrics, "train_step")
    assert sizes, "every width ran out of GPU memory"
    cross = crossover(sizes, wins)
    perf_metrics.record(
        "train_step_crossover_width", cross if cross is not None else -1, "elements"
    )
    require(cmps[sizes[-1]].decide_a_slower(1.0))
    assert cross is not None, [str(c) for c in cmps.values()]


def _iris_steps(device: torch.device, **adam_kw: bool) -> dict[str, Callable[[], object]]:
    steps = {}
    for dev in (torch.device("cpu"), device):
        x, y, _, _ = iris_split(device=dev)
        model = mlp().to(dev)
        opt = torch.optim.Adam(model.parameters(), 1e-2, **adam_kw)
        steps[dev.type] = make_train_step(model, opt, x, y)
    return steps


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_crossover_iris_same_optimizer_faster_on_cpu(device: torch.device, perf_metrics) -> None:
    """The seeds' small problem and their reason for it (001: on tiny data each GPU kernel's
    fixed launch cost outweighs its arithmetic): a full-batch Iris training step (120x4 -> 16
    -> 16 -> 3) running the *same* op sequence on both sides (for-loop Adam, ``foreach=False``)
    is faster on the CPU, with 95% confidence.

    Why this holds by a margin on any host: every op is a few microseconds of host work on
    both sides (the arithmetic on 120x16 tensors is ~1 us), and on the GPU each of the ~60
    device ops additionally pays a CUDA launch through the same host CPU; predicted
    CPU/GPU ~0.5-0.7 (a review estimate, not yet measured on a GPU).
    """
    steps = _iris_steps(device, foreach=False)
    cmp = perf.compare(
        steps["cpu"],
        steps["cuda"],
        device_a="cpu",
        device_b=device,
        pairs=21,
        labels=("iris_cpu_forloop", "iris_gpu_forloop"),
    )
    perf_metrics.record("iris_cpu_over_gpu_step_time_same_adam", cmp, "ratio")
    require(cmp.decide_b_slower(1.0))  # the GPU slower on Iris with the same optimizer


@pytest.mark.perf_cuda
@pytest.mark.perf_timing
def test_crossover_iris_default_optimizers_ratio_recorded(
    device: torch.device, perf_metrics
) -> None:
    """The seeds' literal claim, each device with its default Adam: RECORDED, NOT ASSERTED.

    By default Adam runs its for-loop implementation on the CPU (~108 dispatched ops per Iris
    step) and its foreach implementation on CUDA (~29 kernels): both land near 250-400 us on
    current hardware, so which side wins is decided by the host CPU, the GPU and the driver,
    not by the code. An assertion here would be a coin flip; the ratio goes into the history
    so a change of it is visible.
    """
    steps = _iris_steps(device)
    cmp = perf.compare(
        steps["cpu"],
        steps["cuda"],
        device_a="cpu",
        device_b=device,
        pairs=21,
        labels=("iris_cpu_default_adam", "iris_gpu_default_adam"),
    )
    perf_metrics.record("iris_cpu_over_gpu_step_time_default_adam", cmp, "ratio")
    assert len(cmp.ratios) >= 21 and all(r > 0 for r in cmp.ratios), cmp


# --- on CPU-only CI: the *predicted* crossover, modelled GPU time vs measured CPU time ------

#: up to 512: at the measured host cost (25 us an op) a 256^3 fp32 matmul models 27 us on an H100,
#: a few times faster than this 2-core VM's CPU; 512^3 is where the GPU's win is plain
MODEL_SIZES = (16, 32, 64, 128, 256, 512)


def _skip_host(device: torch.device) -> None:
    if device.type == "cpu":
        pytest.skip(
            "the GPU time model reads a device's op stream: it runs on the `sim` "
            "(CPU-only boxes) and `cuda` parametrizations"
        )


def _cpu_time(fn: Callable[[], object]) -> perf.Timing:
    """The CPU side, kept short (no ``perf_timing`` marker: the device side is modelled, not
    timed, and the claims below hold by a wide margin even on a shared runner)."""
    return perf.measure(fn, warmup=1, min_sample_time_s=0.001, min_samples=7, min_run_time_s=0.01)


def test_crossover_predicted_matmul_modelled_gpu_vs_measured_cpu(
    device: torch.device, perf_gpu_target, perf_metrics
) -> None:
    """fp32 matmuls 16..512: the modelled time on ``--perf-gpu-target`` (default H100 SXM)
    against the CPU's measured time. Predicted: the GPU wins at the largest size by at least
    5x (decided on the CPU's interval; undecidable skips); the predicted crossover size is
    recorded (a prediction, labelled modelled)."""
    from perf.instruments.gpu_model import model_gpu_time

    _skip_host(device)
    sizes, wins = [], []
    with matmul_fp32_precision("ieee"):
        for n in MODEL_SIZES:
            a_dev = torch.randn(n, n, device=device)
            with model_gpu_time(device, perf_gpu_target) as t:
                a_dev @ a_dev
            a_cpu = torch.randn(n, n)
            cpu = _cpu_time(lambda a=a_cpu: a @ a)
            perf_metrics.record(f"matmul_{n}_gpu_time", t.total_s, "modelled_s", **t.metric_extra)
            perf_metrics.record(f"matmul_{n}_cpu_over_modelled_gpu", cpu.median_s / t.total_s, "1")
            sizes.append(n)
            wins.append(cpu.median_s > t.total_s)
            if device.type == "cuda":  # on a GPU: modelled vs measured, for the record
                gpu = perf.measure(lambda a=a_dev: a @ a, device=device, min_run_time_s=0.02)
                perf_metrics.record(
                    f"matmul_{n}_modelled_over_measured", t.total_s / gpu.median_s, "1"
                )
    cross = crossover(sizes, wins)
    perf_metrics.record(
        "matmul_predicted_crossover_size",
        cross if cross is not None else -1,
        "elements",
        modelled=perf_gpu_target.name,
    )
    require(cpu_slower_than_modelled(cpu, t.total_s, 5.0, f"fp32 matmul {sizes[-1]}"))


def test_crossover_predicted_iris_step_modelled_gpu_vs_measured_cpu(
    device: torch.device, perf_gpu_target, perf_metrics
) -> None:
    """The seeds' Iris full-batch step (for-loop Adam, the same ops on both sides): its
    modelled GPU time is launch-bound (every op costs a launch, the arithmetic is tiny), and
    the CPU/modelled-GPU ratio is recorded, not asserted: both sides are a few hundred
    microseconds, so which wins depends on the host CPU (see the measured test above)."""
    from perf.instruments.gpu_model import model_gpu_time

    _skip_host(device)
    steps = _iris_steps(device, foreach=False)
    steps[device.type]()  # Adam's state is created at the first step
    with model_gpu_time(device, perf_gpu_target) as t:
        steps[device.type]()
    cpu = _cpu_time(steps["cpu"])
    perf_metrics.record("iris_step_gpu_time", t.total_s, "modelled_s", **t.metric_extra)
    perf_metrics.record("iris_cpu_over_modelled_gpu", cpu.median_s / t.total_s, "1")
    assert t.bound == "launch", t.result().summary()
    assert t.launches > 40, t.result().summary()
