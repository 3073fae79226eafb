"""The GPU preflight's rules (perf.core.preflight) on recorded nvidia-smi output; the command
and the workflow step are run with a stand-in nvidia-smi in test_workflows.py."""

from __future__ import annotations

import pytest

from perf.core import preflight as pf

CLOCKS = "345, 1980, 2619, 2619"
H100 = "0, GPU-aaaa-0000, NVIDIA H100 80GB HBM3, 570.86.15, {u}, 1, 81559, 31, P0, " + CLOCKS
H100_1 = "1, GPU-bbbb-1111, NVIDIA H100 80GB HBM3, 570.86.15, 0, 1, 81559, 30, P0, " + CLOCKS
HEADER = "| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8     |"


def _gpus(*utils: int, extra: str = "") -> list[pf.GpuState]:
    return pf.parse_gpus([H100.format(u=u) + ("\n" + extra if extra else "") for u in utils])


def test_parse_keeps_every_utilisation_sample_and_reads_na_as_none() -> None:
    na = "0, GPU-aaaa-0000, Tesla T4, 535.1, [N/A], [N/A], 15360, 40, P8, [N/A], [N/A], 405, 5001"
    (g,) = pf.parse_gpus([H100.format(u=3), H100.format(u=5), na.replace("Tesla T4", "T4")])
    assert g.utilization_pct == (3.0, 5.0)  # the [N/A] reading is not a sample
    assert g.sm_clock_mhz is None and g.mem_clock_mhz == 405.0 and g.name == "T4"
    (h,) = _gpus(0)
    assert (h.index, h.sm_clock_mhz, h.sm_clock_max_mhz, h.pstate) == (0, 345.0, 1980.0, "P0")


def test_an_unexpected_line_is_an_error_that_quotes_it() -> None:
    with pytest.raises(pf.PreflightError, match="unexpected line: 'Failed to initialize NVML"):
        pf.parse_gpus(["Failed to initialize NVML: Driver/library version mismatch"])


def test_idle_gpu_of_the_pools_model_passes() -> None:
    p = pf.judge(_gpus(0, 2, 1), [], (12, 8), expect_gpu="H100", torch_cuda="cu128")
    assert p.ok and p.problems == () and p.warnings == ()
    assert p.torch_cuda == (12, 8) and p.driver_cuda == (12, 8)


def test_a_process_on_the_gpu_fails_naming_it() -> None:
    apps = pf.parse_apps("GPU-aaaa-0000, 4242, python3, 20480\nGPU-zzzz-9999, 7, other, 1")
    p = pf.judge(_gpus(0), apps, (12, 8))
    assert not p.ok
    (msg,) = p.problems  # the process on a GPU that is not checked is not this GPU's problem
    assert "GPU 0 (NVIDIA H100 80GB HBM3) is not idle: pid 4242 python3 (20480 MiB)" in msg


def test_utilisation_without_a_visible_process_fails_on_the_median() -> None:
    assert pf.judge(_gpus(0, 95, 0), [], None).ok  # one busy reading: the median is 0
    p = pf.judge(_gpus(40, 95, 60), [], None)
    assert not p.ok and "60% utilisation (median of 3 samples, limit 10%)" in p.problems[0]
    assert pf.judge(_gpus(40, 95, 60), [], None, max_utilization_pct=70).ok


def test_another_gpu_model_is_not_this_pool() -> None:
    p = pf.judge(_gpus(0), [], None, expect_gpu="A100")
    assert not p.ok and "is not a 'A100'" in p.problems[0] and "gpu_name" in p.problems[0]
    assert pf.judge(_gpus(0), [], None, expect_gpu="h100").ok  # case-insensitive


@pytest.mark.parametrize(
    ("driver", "tag", "ok", "warned"),
    [
        ((12, 8), "cu128", True, False),
        ((12, 4), "cu126", True, True),  # newer minor: minor-version compatibility, said
        ((12, 8), "cu118", True, False),  # older major: forward compatible driver
        ((12, 8), "cu130", False, False),  # newer major: torch would not see the GPU
        (None, "cu128", True, True),
    ],
)
def test_driver_against_the_wheels_cuda(
    driver: tuple[int, int] | None, tag: str, ok: bool, warned: bool
) -> None:
    p = pf.judge(_gpus(0), [], driver, torch_cuda=tag)
    assert p.ok is ok and bool(p.warnings) is warned
    if not ok:
        assert "built for CUDA 13.0 (cu130)" in p.problems[0] and "cu12x" in p.problems[0]


def test_wheel_variants_and_a_bad_one() -> None:
    assert pf.wheel_cuda("cu128") == (12, 8) and pf.wheel_cuda("CU130") == (13, 0)
    assert pf.wheel_cuda("cu118") == (11, 8)
    with pytest.raises(ValueError, match="not of the form cuXYZ"):
        pf.wheel_cuda("cpu")


def test_driver_cuda_from_the_header() -> None:
    assert pf.parse_driver_cuda(HEADER) == (12, 8)
    assert pf.parse_driver_cuda("    CUDA Version                          : 13.0") == (13, 0)
    assert pf.parse_driver_cuda("no header") is None


def test_unreported_clocks_are_a_warning_not_a_failure() -> None:
    na = H100.format(u=0).replace("345, 1980", "[N/A], [N/A]")
    p = pf.judge(pf.parse_gpus([na]), [], None)
    assert p.ok and "does not report its SM clock" in p.warnings[0]


def test_cuda_visible_devices_selects_as_cuda_does() -> None:
    gpus = pf.parse_gpus([H100.format(u=0) + "\n" + H100_1])
    assert [g.index for g in pf.visible(gpus, None)] == [0, 1]
    assert [g.index for g in pf.visible(gpus, "1")] == [1]
    assert [g.index for g in pf.visible(gpus, "GPU-bbbb,0")] == [1, 0]
    assert [g.index for g in pf.visible(gpus, "0,7,1")] == [0]  # CUDA stops at an invalid id
    assert pf.visible(gpus, "") == []
    assert "lists no GPU" in pf.judge([], [], None).problems[0]


def test_query_asks_each_question_once_per_sample() -> None:
    calls: list[list[str]] = []
    answers = {"--query-gpu": H100.format(u=0), "--query-compute-apps": "", "": HEADER}

    def run(args: list[str]) -> str:
        calls.append(args)
        return answers[args[0].split("=")[0] if args else ""]

    gpus, apps, driver = pf.query(samples=2, interval_s=0, run=run)
    assert [c[0].split("=")[0] for c in calls if c] == ["--query-gpu"] * 2 + [
        "--query-compute-apps"
    ]
    assert gpus[0].utilization_pct == (0.0, 0.0) and apps == [] and driver == (12, 8)


def test_markdown_reports_the_clocks_and_the_verdict() -> None:
    p = pf.judge(_gpus(0), [], (12, 8), expect_gpu="A100")
    text = "\n".join(pf.markdown(p))
    assert "GPU preflight: FAILED" in text and "345 MHz / 1980 MHz" in text
    assert "2619 MHz / 2619 MHz" in text and "Driver supports CUDA 12.8" in text
    assert p.as_json()["ok"] is False and p.as_json()["schema"] == "perf-gpu-preflight/1"


def test_untrusted_names_cannot_forge_workflow_commands() -> None:
    from perf.report.text import annotation

    line = annotation("error", "GPU: pre,flight", "pid 1 evil\n::add-mask::x 100%")
    assert line == "::error title=GPU%3A pre%2Cflight::pid 1 evil\\x0a::add-mask::x 100%25"
    assert "\n" not in line
    with pytest.raises(ValueError, match="error, warning or notice"):
        annotation("debug", "t", "m")
