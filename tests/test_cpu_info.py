"""``/proc/cpuinfo``'s first processor, as the FP8 kernel pins and the fused pass's library name read it."""

from system.correction.fused_build import isa_key
from system.cpu_info import cpuinfo_fields
from system.rollout.fp8_kernels import cpu_identity

TWO_PROCESSORS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 hypervisor

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu avx2
"""


def test_the_first_processors_fields():
    fields = cpuinfo_fields(TWO_PROCESSORS)
    assert fields["processor"] == "0"
    assert fields["model name"] == "Intel(R) Xeon(R) Platinum 8481C"
    assert fields["flags"] == "fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 hypervisor"
    assert cpu_identity(TWO_PROCESSORS) == "Intel(R) Xeon(R) Platinum 8481C [amx_bf16 amx_tile avx2 avx512_bf16 avx512f]"
    assert cpu_identity("") == "unknown CPU []"


def test_arm_features_name_the_library_too():
    arm = "processor\t: 0\nFeatures\t: fp asimd sha1 aes\n"
    assert isa_key(arm) != isa_key("processor\t: 0\nFeatures\t: fp asimd\n")  # aes is an instruction set
    assert isa_key(arm) == isa_key(arm.replace("fp asimd sha1 aes", "aes sha1 asimd fp"))
