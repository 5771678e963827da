"""What `repro doctor` flags in a report, and the container its `--image` form runs in."""

from __future__ import annotations

from typing import Any

import pytest

from worker.node.readiness_probe import (
    READINESS_ARGS,
    container_options,
    job_user,
    parse_report,
    registration_flags,
)
from worker.record.readiness import (
    flags,
    notes,
    parse_cpuinfo,
    parse_cuda_version,
    parse_cudnn_version,
    parse_xla_flags,
    summary_lines,
    unique_log_lines,
)

A100 = {
    "index": 0,
    "name": "NVIDIA A100-SXM4-40GB",
    "compute_capability": "8.0",
    "sm_count": 108,
    "driver_version": "555.42",
}
V100 = {**A100, "index": 1, "name": "Tesla V100-SXM2-16GB", "compute_capability": "7.0"}
THREADS = {"OMP_NUM_THREADS": "4", "TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "1"}


def _report(**changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "gpus": [A100],
        "tensorflow": "2.21.0",
        "tensorflow_gpu_count": 1,
        "cuda": {
            "built": {"cuda": "12.5.1", "cudnn": "9"},
            "loaded": {"runtime_version": "12.5", "cudnn_version": "9.3.0"},
            "lock": {"cuda": "12.5.82", "cudnn": "9.3.0.75"},
        },
        "tf32": {"enabled": False, "NVIDIA_TF32_OVERRIDE": None, "applies": True},
        "op_determinism": {"TF_DETERMINISTIC_OPS": "1"},
        "threads": dict(THREADS),
        "environment": {},
        "probe_errors": {},
    }
    report.update(changes)
    return report


def _checks(report: dict[str, Any]) -> list[str]:
    return [f["check"] for f in flags(report)]


def test_a_machine_set_up_for_reruns_has_nothing_flagged() -> None:
    assert flags(_report()) == []
    assert "nothing flagged" in summary_lines(_report())


def test_tf32_is_flagged_only_where_a_gpu_uses_it_and_nothing_overrides_it() -> None:
    on = {"enabled": True, "NVIDIA_TF32_OVERRIDE": None, "applies": True}
    assert _checks(_report(tf32=on)) == ["tf32"]
    assert _checks(_report(tf32={**on, "NVIDIA_TF32_OVERRIDE": "0"})) == []
    assert _checks(_report(tf32={**on, "applies": False}, gpus=[V100])) == []


def test_op_determinism_off_is_flagged_and_thread_counts_left_to_the_machine_are_a_note() -> None:
    off = _report(op_determinism={"TF_DETERMINISTIC_OPS": "0"})
    assert _checks(off) == ["op_determinism"]
    assert notes(_report()) == []
    unset = _report(threads={**THREADS, "TF_NUM_INTEROP_THREADS": None})
    assert flags(unset) == []
    (note,) = notes(unset)
    assert note["check"] == "threads" and "export TF_NUM_INTEROP_THREADS=1" in note["message"]


def test_cuda_and_cudnn_other_than_the_build_and_the_lock_are_flagged() -> None:
    cuda = _report()["cuda"]
    loaded = {**cuda, "loaded": {"runtime_version": "12.4", "cudnn_version": "9.3.0"}}
    (flag,) = flags(_report(cuda=loaded))
    assert flag["check"] == "cuda"
    assert flag["message"] == (
        "CUDA 12.4 is loaded, TensorFlow was built for 12.5.1 and the image's lock pins 12.5.82"
    )
    locked = {**cuda, "lock": {"cuda": "12.5.82", "cudnn": "8.9.7.29"}}
    assert [f["message"] for f in flags(_report(cuda=locked))] == [
        "cuDNN 9.3.0 is loaded, the image's lock pins 8.9.7.29",
        "the image's lock pins cuDNN 8.9.7.29, TensorFlow was built for 9",
    ]
    # Without a GPU nothing loads the libraries: only the lock is compared.
    assert flags(_report(gpus=[], cuda={**loaded, "lock": None})) == []


def test_mixed_gpus_hidden_gpus_and_cudnn_variables_are_flagged() -> None:
    assert _checks(_report(gpus=[A100, V100])) == ["gpus"]
    assert _checks(_report(tensorflow_gpu_count=0)) == ["gpus"]
    steered = _report(environment={"TF_CUDNN_USE_AUTOTUNE": "0"})
    assert _checks(steered) == ["environment"]
    assert flags(_report(gpus=[], environment={"TF_CUDNN_USE_AUTOTUNE": "0"})) == []


def test_the_checks_container_follows_the_docker_executors_sandbox() -> None:
    environ = {"TF_DETERMINISTIC_OPS": "0", "OMP_NUM_THREADS": "2", "AWS_SECRET_KEY": "x"}
    options = container_options("sha256:abc", gpus=False, user="65534:65534", environ=environ)
    assert options["entrypoint"] == ["python3", *READINESS_ARGS]
    assert options["network_mode"] == "none" and options["read_only"] is True
    assert options["cap_drop"] == ["ALL"] and options["security_opt"] == ["no-new-privileges"]
    assert options["device_requests"] == []
    assert options["environment"]["TF_DETERMINISTIC_OPS"] == "0"
    assert "AWS_SECRET_KEY" not in options["environment"]
    with_gpus = container_options("sha256:abc", gpus=True, user="1000", environ={})
    (request,) = with_gpus["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert with_gpus["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert job_user("root") == job_user("") == "65534:65534"
    assert job_user("1000:1000") == "1000:1000"


def test_a_report_is_read_from_the_last_line_and_cut_to_a_registrations_bounds() -> None:
    report = parse_report(
        'warning from a library\n{"flags": [{"check": "tf32", "message": "x"}]}\n'
    )
    assert report["flags"] == [{"check": "tf32", "message": "x"}]
    with pytest.raises(ValueError):
        parse_report("")
    many = {"flags": [{"check": "c" * 50, "message": "m" * 2000}] * 40}
    cut = registration_flags(many)
    assert len(cut) == 32
    assert len(cut[0]["check"]) == 40 and len(cut[0]["message"]) == 1000


def test_cuda_and_cudnn_versions_are_read_from_every_form_real_systems_print() -> None:
    # cudnnGetVersion(): major*10000 + minor*100 + patch from cuDNN 9, major*1000 + ... before.
    assert parse_cudnn_version(90100) == (9, 1, 0)
    assert parse_cudnn_version(91002) == (9, 10, 2)
    assert parse_cudnn_version(90300) == (9, 3, 0)
    assert parse_cudnn_version(8906) == (8, 9, 6)
    assert parse_cudnn_version("8906") == (8, 9, 6)
    # tf.sysconfig.get_build_info()["cudnn_version"] gives the major only; a lock the wheel's.
    assert parse_cudnn_version("9") == (9,)
    assert parse_cudnn_version("8") == (8,)
    assert parse_cudnn_version("9.3.0.75") == (9, 3, 0, 75)
    # cudaDriverGetVersion() / cudaRuntimeGetVersion(): major*1000 + minor*10, no patch.
    assert parse_cuda_version(12050) == (12, 5)
    assert parse_cuda_version(12080) == (12, 8)
    assert parse_cuda_version(11080) == (11, 8)
    assert parse_cuda_version("12.5.1") == (12, 5, 1)
    assert parse_cuda_version("12.5.82") == (12, 5, 82)
    assert parse_cuda_version("12.4") == (12, 4)
    # Windows builds of old TensorFlow wrote "64_8"; nothing to compare in it.
    for unreadable in (None, "", "64_8", "unknown", True, -1):
        assert parse_cudnn_version(unreadable) is None
        assert parse_cuda_version(unreadable) is None


def _cudnn(*, loaded: Any, lock: str | None, built: str = "9") -> dict[str, Any]:
    return _report(
        cuda={
            "built": {"cuda": "12.5.1", "cudnn": built},
            "loaded": {"runtime_version": "12.5", "cudnn_version": loaded},
            "lock": {"cuda": "12.5.82", "cudnn": lock},
        }
    )


def test_a_loaded_cudnn_is_compared_with_the_lock_to_the_patch() -> None:
    (flag,) = flags(_cudnn(loaded="9.10.2", lock="9.1.0"))
    assert flag["check"] == "cuda"
    assert flag["message"] == "cuDNN 9.10.2 is loaded, the image's lock pins 9.1.0"
    (flag,) = flags(_cudnn(loaded=91002, lock="9.1.0"))
    assert flag["message"] == "cuDNN 9.10.2 is loaded, the image's lock pins 9.1.0"
    (flag,) = flags(_cudnn(loaded="9.1.0", lock="9.1.1"))
    assert flag["message"] == "cuDNN 9.1.0 is loaded, the image's lock pins 9.1.1"
    # The wheel's fourth number is a build cudnnGetVersion() does not carry.
    assert flags(_cudnn(loaded=90300, lock="9.3.0.75")) == []
    assert notes(_cudnn(loaded=90300, lock="9.3.0.75")) == []
    # Another major disagrees with TensorFlow's build too: one flag names all three.
    (flag,) = flags(_cudnn(loaded=8906, lock="9.3.0.75", built="9"))
    assert flag["message"] == (
        "cuDNN 8.9.6 is loaded, TensorFlow was built for 9 and the image's lock pins 9.3.0.75"
    )


def test_a_lock_that_pins_only_the_major_is_compared_that_far_and_noted() -> None:
    report = _cudnn(loaded="9.10.2", lock="9")
    assert flags(report) == []
    (note,) = [n for n in notes(report) if n["check"] == "cuda"]
    assert note["message"] == (
        "the image's lock pins only the major version of cuDNN (9), so the loaded and built "
        "cuDNN were compared to the major version only; pin the full version in the lock to "
        "compare to the major.minor.patch version"
    )
    assert [f["message"] for f in flags(_cudnn(loaded="8.9.7", lock="9", built="8"))] == [
        "cuDNN 8.9.7 is loaded, the image's lock pins 9",
        "the image's lock pins cuDNN 9, TensorFlow was built for 8",
    ]


def test_cuda_is_compared_to_the_minor_the_runtime_integer_carries() -> None:
    cuda = _report()["cuda"]
    same = {**cuda, "loaded": {"runtime_version": 12050, "cudnn_version": 90300}}
    assert flags(_report(cuda=same)) == []
    older = {**cuda, "loaded": {"runtime_version": 12040, "cudnn_version": 90300}}
    (flag,) = flags(_report(cuda=older))
    assert flag["message"].startswith("CUDA 12.4 is loaded, TensorFlow was built for 12.5.1")
    line = next(x for x in summary_lines(_report(cuda=older)) if x.startswith("CUDA built"))
    assert line == (
        "CUDA built 12.5.1, loaded 12.4, locked 12.5.82; cuDNN built 9, loaded 9.3.0, "
        "locked 9.3.0.75"
    )
    unreadable = {**cuda, "built": {"cuda": "64_112", "cudnn": "64_8"}}
    assert flags(_report(cuda=unreadable)) == []
    messages = [n["message"] for n in notes(_report(cuda=unreadable))]
    assert "cuDNN version '64_8' of TensorFlow's build is unreadable: not compared" in messages


def test_xla_flags_are_read_as_xla_reads_them() -> None:
    assert parse_xla_flags(None) is None
    assert parse_xla_flags("") == {}
    assert parse_xla_flags("--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0") == {
        "xla_gpu_deterministic_ops": "true",
        "xla_gpu_autotune_level": "0",
    }
    assert parse_xla_flags(
        '--xla_dump_to="/tmp/xla dumps"  --xla_gpu_enable_latency_hiding_scheduler\n'
        "--xla_gpu_autotune_level=4 --xla_gpu_autotune_level=2"
    ) == {
        "xla_dump_to": "/tmp/xla dumps",
        "xla_gpu_enable_latency_hiding_scheduler": "true",
        "xla_gpu_autotune_level": "2",
    }
    assert parse_xla_flags("--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit") == {
        "tf_xla_auto_jit": "2",
        "tf_xla_cpu_global_jit": "true",
    }


def test_xla_told_to_drop_deterministic_ops_is_a_note_not_a_flag() -> None:
    xla = {"XLA_FLAGS": parse_xla_flags("--xla_gpu_deterministic_ops=false"), "TF_XLA_FLAGS": None}
    report = _report(xla=xla, environment={"XLA_FLAGS": "--xla_gpu_deterministic_ops=false"})
    assert flags(report) == []
    (note,) = notes(report)
    assert note["check"] == "xla"
    assert note["message"].startswith("XLA_FLAGS sets --xla_gpu_deterministic_ops=false:")
    assert "remove it from XLA_FLAGS" in note["message"]
    assert "XLA_FLAGS=--xla_gpu_deterministic_ops=false; TF_XLA_FLAGS=(unset)" in summary_lines(
        report
    )
    on = {"XLA_FLAGS": parse_xla_flags("--xla_gpu_deterministic_ops"), "TF_XLA_FLAGS": None}
    assert notes(_report(xla=on)) == []
    tuned = {"XLA_FLAGS": parse_xla_flags("--xla_gpu_autotune_level=4"), "TF_XLA_FLAGS": None}
    assert flags(_report(xla=tuned)) == [] and notes(_report(xla=tuned)) == []


INTEL_CPUINFO = """\
processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 143
model name	: Intel(R) Xeon(R) Platinum 8488C
stepping	: 8
microcode	: 0x2b000590
cpu MHz		: 2400.000
cache size	: 107520 KB
physical id	: 0
siblings	: 4
core id		: 0
cpu cores	: 2
fpu		: yes
fpu_exception	: yes
cpuid level	: 31
wp		: yes
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology \
nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq monitor ssse3 fma cx16 pdcm pcid \
sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor \
lahf_lm abm 3dnowprefetch ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 \
smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd \
sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd ida arat \
avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
tme avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear serialize amx_bf16 avx512_fp16 \
amx_tile amx_int8 flush_l1d arch_capabilities
bugs		: spectre_v1 spectre_v2 spec_store_bypass swapgs eibrs_pbrsb
bogomips	: 4800.00
clflush size	: 64
cache_alignment	: 64
address sizes	: 46 bits physical, 48 bits virtual
power management:

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8488C
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep
"""

EPYC_CPUINFO = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC 7763 64-Core Processor
stepping	: 1
microcode	: 0xa0011d1
cpu MHz		: 2445.404
cache size	: 512 KB
physical id	: 0
siblings	: 4
core id		: 0
cpu cores	: 2
fpu		: yes
fpu_exception	: yes
cpuid level	: 13
wp		: yes
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl \
tsc_reliable nonstop_tsc cpuid extd_apicid aperfmperf pni pclmulqdq ssse3 fma cx16 pcid sse4_1 \
sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm \
sse4a misalignsse 3dnowprefetch osvw topoext invpcid_single vmmcall fsgsbase bmi1 avx2 smep \
bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero \
xsaveerptr rdpru arat npt nrip_save umip vaes vpclmulqdq rdpid fsrm
bugs		: sysret_ss_attrs null_seg spectre_v1 spectre_v2 spec_store_bypass srso
bogomips	: 4890.80
TLB size	: 2560 4K pages
clflush size	: 64
cache_alignment	: 64
address sizes	: 48 bits physical, 48 bits virtual
power management:

"""

ARM_CPUINFO = """\
processor	: 0
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
CPU implementer	: 0x41
CPU architecture: 8
"""


def test_the_cpu_is_read_from_real_cpuinfo_text() -> None:
    assert parse_cpuinfo(INTEL_CPUINFO) == {
        "vendor": "GenuineIntel",
        "model": "Intel(R) Xeon(R) Platinum 8488C",
        "isa": "avx512_core_amx",
        "amx": ["amx_bf16", "amx_int8", "amx_tile"],
    }
    assert parse_cpuinfo(INTEL_CPUINFO, "AVX512_CORE")["isa"] == "avx512_core"
    assert parse_cpuinfo(EPYC_CPUINFO) == {
        "vendor": "AuthenticAMD",
        "model": "AMD EPYC 7763 64-Core Processor",
        "isa": "avx2",
        "amx": [],
    }
    old = EPYC_CPUINFO.replace(" avx2", "").replace(" avx ", " ")
    assert parse_cpuinfo(old)["isa"] == "sse41"
    arm = parse_cpuinfo(ARM_CPUINFO)
    assert (arm["vendor"], arm["isa"]) == ("0x41", "baseline")
    assert parse_cpuinfo("")["isa"] is None


def test_the_summary_shows_the_cpu_onednn_and_the_variables_that_pick_devices() -> None:
    report = _report(
        cpu={**parse_cpuinfo(INTEL_CPUINFO), "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
        onednn={"enabled": True, "TF_ENABLE_ONEDNN_OPTS": None},
        environment={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "CUDA_VISIBLE_DEVICES": ""},
    )
    lines = summary_lines(report)
    assert (
        "CPU: Intel(R) Xeon(R) Platinum 8488C (GenuineIntel), ISA avx512_core_amx with AMX "
        "(amx_bf16, amx_int8, amx_tile); ONEDNN_MAX_CPU_ISA=AVX512_CORE"
    ) in lines
    assert "oneDNN custom operations on; TF_ENABLE_ONEDNN_OPTS=(unset)" in lines
    assert 'CUDA_VISIBLE_DEVICES=""' in lines
    assert "XLA_FLAGS=(unset); TF_XLA_FLAGS=(unset)" in lines
    assert not any(line.startswith("ONEDNN_MAX_CPU_ISA=") for line in lines)


BANNER = (
    "oneDNN custom operations are on. You may see slightly different numerical results due to "
    "floating-point round-off errors from different computation orders. To turn them off, set "
    "the environment variable `TF_ENABLE_ONEDNN_OPTS=0`."
)
CUDNN_FACTORY = (
    "Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one "
    "has already been registered"
)


def test_tensorflows_repeated_start_up_lines_are_kept_once() -> None:
    absl = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
    stderr = (
        f"{absl}\n"
        f"I0000 00:00:1796489805.889274    1283 port.cc:153] {BANNER}\n"
        f"E0000 00:00:1721389428.143153    1283 cuda_dnn.cc:8310] {CUDNN_FACTORY}\n"
        "\n"
        f"{absl}\n"
        f"I0000 00:00:1796489808.100722    1283 port.cc:153] {BANNER}\n"
        f"E0000 00:00:1721389430.001002    1283 cuda_dnn.cc:8310] {CUDNN_FACTORY}\n"
        "\n"
        "W0515 12:34:56.789012    1283 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n"
    )
    kept = unique_log_lines(stderr)
    assert kept == [
        f"{absl}\n",
        f"I0000 00:00:1796489805.889274    1283 port.cc:153] {BANNER}\n",
        f"E0000 00:00:1721389428.143153    1283 cuda_dnn.cc:8310] {CUDNN_FACTORY}\n",
        "\n",
        "\n",
        "W0515 12:34:56.789012    1283 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n",
    ]
