"""Hardware classes from what real machines print: /proc/cpuinfo of Intel and AMD servers
and an ARM one, the NVIDIA driver's version files, CUDA device names of whole GPUs and MIG
slices; and which classes a requirement admits."""

from __future__ import annotations

import pytest

from worker.node.registration import GpusMissing, expected_gpus
from worker.record import hardware

SAPPHIRE_RAPIDS = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme de pse tsc msr pae mce sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f \
avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8
"""
EPYC_MILAN = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 7763 64-Core Processor
flags\t\t: fpu vme de pse tsc msr pae mce sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2 sha_ni
"""
GRAVITON = """\
processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
CPU implementer\t: 0x41
CPU architecture: 8
"""
PROC_DRIVER = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  555.42.02  Wed Apr 24 23:12:25 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
H100 = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "memory_bytes": 81559 * 2**20}
A100_MIG = {
    "name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    "sm_count": 14,
    "memory_bytes": 4_865_392_640,
}


def test_cpu_classes_name_vendor_model_and_the_widest_isa_onednn_may_use() -> None:
    intel = hardware.cpu_class(SAPPHIRE_RAPIDS, isa_cap=None)
    assert intel["class"] == "cpu:genuineintel:intel-r-xeon-r-platinum-8480:avx512-core-amx"
    assert intel["isa"] == "avx512_core_amx"
    amd = hardware.cpu_class(EPYC_MILAN, isa_cap=None)
    assert amd["class"] == "cpu:authenticamd:amd-epyc-7763-64-core-processor:avx2"
    arm = hardware.cpu_class(GRAVITON, isa_cap=None)
    assert arm["class"] == "cpu:0x41:unknown:baseline"
    # ONEDNN_MAX_CPU_ISA caps what oneDNN dispatches to, so it caps the class too; a cap
    # wider than the CPU, or "ALL", changes nothing.
    capped = hardware.cpu_class(SAPPHIRE_RAPIDS, isa_cap="AVX2")
    assert capped["class"].endswith(":avx2")
    assert hardware.cpu_class(EPYC_MILAN, isa_cap="avx512_core")["isa"] == "avx2"
    assert hardware.cpu_class(EPYC_MILAN, isa_cap="ALL")["isa"] == "avx2"


def test_gpu_classes_tell_products_mig_slices_and_driver_majors_apart() -> None:
    whole = hardware.gpu_class(H100, driver_text=PROC_DRIVER)
    assert whole["class"] == "gpu:nvidia-h100-80gb-hbm3:sm132:80gb:full:drv555"
    assert (whole["product"], whole["driver_major"]) == ("NVIDIA H100 80GB HBM3", 555)
    # A MIG slice is its parent's product with its own SMs, memory and profile.
    mig = hardware.gpu_class(A100_MIG, driver_text="550.54.15\n")
    assert mig["class"] == "gpu:nvidia-a100-sxm4-40gb:sm14:5gb:1g.5gb:drv550"
    assert hardware.gpu_class(H100, driver_text=None)["class"].endswith(":drvunknown")
    assert (
        hardware.driver_major("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15")
        == 570
    )


def test_a_machine_is_classed_by_its_gpus_and_mixed_gpus_are_said() -> None:
    found = hardware.hardware_class(
        [H100, {**H100, "name": "NVIDIA H100 PCIe", "sm_count": 114}],
        cpuinfo_text=SAPPHIRE_RAPIDS,
        driver_text=PROC_DRIVER,
        environ={},
    )
    assert found["class"].startswith("gpu:nvidia-h100-80gb-hbm3:")
    assert len(found["mixed"]) == 2
    cpu_only = hardware.hardware_class(
        [], cpuinfo_text=EPYC_MILAN, driver_text=None, environ={"ONEDNN_MAX_CPU_ISA": "AVX"}
    )
    assert cpu_only["class"].endswith(":avx")


@pytest.mark.parametrize(
    ("requirement", "admitted"),
    [
        (None, True),
        ("gpu", True),
        ("gpu:nvidia-h100-80gb-hbm3", True),
        ("gpu:nvidia-h100-80gb-hbm3:sm132:80gb:full:drv555", True),
        ("gpu:nvidia-h100", False),  # a segment is matched whole, not a prefix of one
        ("gpu:nvidia-h100-80gb-hbm3:sm114", False),
        ("cpu", False),
    ],
)
def test_a_requirement_admits_the_classes_it_leads(requirement: str | None, admitted: bool) -> None:
    h100 = "gpu:nvidia-h100-80gb-hbm3:sm132:80gb:full:drv555"
    assert hardware.matches(requirement, h100) is admitted
    assert hardware.matches(requirement, None) is (requirement is None)


def test_an_agent_told_to_expect_gpus_refuses_to_start_without_them() -> None:
    expected_gpus({}, 0)
    expected_gpus({"REPRO_EXPECT_GPUS": "2"}, 2)
    with pytest.raises(GpusMissing, match="REPRO_EXPECT_GPUS=1, but the CUDA driver shows 0"):
        expected_gpus({"REPRO_EXPECT_GPUS": "1"}, 0)
    with pytest.raises(GpusMissing, match="whole number"):
        expected_gpus({"REPRO_EXPECT_GPUS": "one"}, 0)
