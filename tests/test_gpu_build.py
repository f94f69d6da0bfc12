"""The GPU build, proved without a GPU: struct layout, kernel resources, launch configuration.

* The device batch uploads the host-built Env struct byte for byte, so NVRTC's
  layout of every env's struct must equal the host compiler's: sizeof, alignment
  and every field's offset and size (the fields read from the host compiler's debug
  information, one expression list compiled by both; envs/gpu/audit.py).
* Every env's kernels compile to an sm_90 cubin; ptxas' report has no spill in any
  kernel and no local-memory stack in the step kernel beyond what the header
  declares (PG_GPU_STACK).
* The launch configuration gives one thread per instance within CUDA's limits, up
  to the largest batch an int index allows.
Each check is also shown to fail when the property is broken on purpose.
"""
import importlib.util
import shutil

import pytest

from peregrine.envs.gpu import audit as gpu_audit
from peregrine.envs.gpu import compiler as gpu

ENVS = gpu.header_names()
HAVE_NVRTC = importlib.util.find_spec("cuda") is not None and \
    importlib.util.find_spec("cuda.bindings") is not None
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="NVRTC not installed (the cuda extra: "
                                                        "pip install 'peregrine-rl[cuda]')")
HAVE_HOST_TOOLS = shutil.which("readelf") is not None and (
    shutil.which("cc") or shutil.which("gcc")) is not None
needs_host_tools = pytest.mark.skipif(not HAVE_HOST_TOOLS,
                                      reason="no C compiler or readelf (binutils) to read the "
                                             "host layout with")


@pytest.fixture
def tree_copy(tmp_path, monkeypatch):
    """A copy of the env headers that the compiler and the audit compile instead."""
    tree = tmp_path / "envs"
    shutil.copytree(gpu.ENVS_DIR, tree, ignore=shutil.ignore_patterns("*.so", "*.py",
                                                                      "__pycache__"))
    monkeypatch.setattr(gpu, "ENVS_DIR", tree)
    monkeypatch.setattr(gpu, "NATIVE_DIR", tree / "native")
    return tree


def edit(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {path.name}"
    path.write_text(text.replace(old, new))


# ---- layout --------------------------------------------------------------------------

@needs_nvrtc
@needs_host_tools
@pytest.mark.parametrize("name", ENVS)
def test_nvrtc_lays_out_the_env_struct_as_the_host_compiler_does(name):
    report = gpu_audit.check_layout(name)
    assert report.ok, "\n".join(report.mismatches)
    # The field list is the whole struct: the batch contract's members and the env's own.
    for member in ("pg", "pg.num_envs", "pg.rng", "pg.stats", "pg.allocs",
                   "pg.allocs[0].bytes", "pg.action_nvec"):
        assert member in report.fields
    assert len(report.fields) > len([f for f in report.fields if f.startswith("pg")])
    assert len(report.host) == 2 + 2 * len(report.fields)
    assert report.size == report.host[0] > 0


@needs_nvrtc
@needs_host_tools
def test_the_layout_check_catches_a_field_that_moves_on_the_gpu(tree_copy):
    """A member that exists only under NVRTC shifts every later field: found and named."""
    edit(tree_copy / "cartpole" / "cartpole.h", "    int max_steps;\n",
         "#ifdef __CUDACC_RTC__\n    int gpu_only;\n#endif\n    int max_steps;\n")
    report = gpu_audit.check_layout("cartpole")
    assert not report.ok
    assert any(m.startswith("offsetof(max_steps): host ") for m in report.mismatches)
    assert any(m.startswith("offsetof(x): ") for m in report.mismatches)   # later pointers too


@needs_nvrtc
@needs_host_tools
def test_the_layout_check_catches_a_type_that_differs_on_the_gpu(tree_copy):
    """Same fields in the same order, one of another size under NVRTC."""
    edit(tree_copy / "cartpole" / "cartpole.h", "    int max_steps;\n",
         "#ifdef __CUDACC_RTC__\n    long long max_steps;\n#else\n    int max_steps;\n"
         "#endif\n")
    report = gpu_audit.check_layout("cartpole")
    assert "sizeof(max_steps): host 4, NVRTC 8" in report.mismatches


@needs_host_tools
@pytest.mark.parametrize("name", ENVS)
def test_every_pointer_in_the_env_struct_is_mirrored_on_the_gpu(name):
    """Each pointer member (from the debug information) is a PG_ALLOC array or a
    PgBatch buffer, the two kinds the GPU batch replaces with device pointers."""
    from peregrine.envs.registry import env_class
    assert gpu_audit.pointer_problems(name, env_class(name)) == []


@needs_host_tools
def test_the_pointer_check_catches_a_pointer_not_made_by_pg_alloc(tree_copy):
    """A member pointer env_init would fill with malloc (or an array of them) would
    reach the GPU as a host address: named, with its byte."""
    from peregrine.envs.registry import env_class
    edit(tree_copy / "cartpole" / "cartpole.h", "    int max_steps;\n",
         "    int max_steps;\n    float *scratch;\n    double *rows[2];\n")
    problems = gpu_audit.pointer_problems("cartpole", env_class("cartpole"))
    assert any(p.startswith("scratch (byte ") and "not allocated with PG_ALLOC" in p
               for p in problems), problems
    assert "rows: an array of pointers cannot be mirrored on the GPU" in problems


def test_dwarf_members_are_read_recursively():
    """The debug-information reader on a small readelf dump: nested structs, arrays of
    structs and anonymous members become designators."""
    dump = """
 <1><10>: Abbrev Number: 2 (DW_TAG_structure_type)
    <11>   DW_AT_byte_size   : 16
 <2><12>: Abbrev Number: 3 (DW_TAG_member)
    <13>   DW_AT_name        : (indirect string, offset: 0x1): offset
    <14>   DW_AT_type        : <0x40>
 <1><20>: Abbrev Number: 4 (DW_TAG_array_type)
    <21>   DW_AT_type        : <0x10>
 <2><22>: Abbrev Number: 5 (DW_TAG_subrange_type)
    <23>   DW_AT_upper_bound : 3
 <1><30>: Abbrev Number: 2 (DW_TAG_structure_type)
    <31>   DW_AT_name        : Env
 <2><32>: Abbrev Number: 3 (DW_TAG_member)
    <33>   DW_AT_name        : count
    <34>   DW_AT_type        : <0x40>
 <2><35>: Abbrev Number: 3 (DW_TAG_member)
    <36>   DW_AT_name        : slots
    <37>   DW_AT_type        : <0x20>
 <2><38>: Abbrev Number: 3 (DW_TAG_member)
    <39>   DW_AT_type        : <0x10>
 <1><40>: Abbrev Number: 6 (DW_TAG_base_type)
    <41>   DW_AT_name        : int
"""
    entries = gpu_audit._parse_dwarf(dump)
    assert gpu_audit._member_paths(entries, entries[0x30], "") == [
        "count", "slots", "slots[0].offset", "offset"]


def test_ptx_arrays_are_read_in_both_encodings():
    as_bytes = ".global .align 8 .b8 pg_layout[24] = {184, 4, 0, 0, 0, 0, 0, 0, 8};"
    assert gpu_audit.parse_ptx_array(as_bytes, 3) == [1208, 8, 0]
    as_words = ".global .align 8 .u64 pg_layout[2] = {1208, 8};"
    assert gpu_audit.parse_ptx_array(as_words, 2) == [1208, 8]
    with pytest.raises(RuntimeError, match="expected 4"):
        gpu_audit.parse_ptx_array(as_words, 4)
    with pytest.raises(RuntimeError, match="no pg_layout"):
        gpu_audit.parse_ptx_array(".global .u64 other[2];", 2)


# ---- kernel resources ----------------------------------------------------------------

@needs_nvrtc
@pytest.mark.parametrize("name", ENVS)
def test_every_env_compiles_to_an_sm90_cubin_without_spills_or_undeclared_stack(name):
    report = gpu_audit.kernel_resources(name)
    assert set(gpu_audit.KERNELS) <= set(report)
    for kernel in gpu_audit.KERNELS:
        assert 0 < report[kernel]["registers"] <= 255
    assert gpu_audit.resource_problems(name, report) == []
    allowance = gpu_audit.stack_allowance(name)
    if allowance is None:
        assert report["pg_step"]["stack"] == 0
    else:                    # a declaration is a ceiling with a reason, not a blank cheque
        assert report["pg_step"]["stack"] > 0 and allowance[1]


@needs_nvrtc
def test_the_resource_check_catches_a_forced_spill():
    """Capping registers at 16 makes ptxas spill CartPole's step: a failure, named."""
    report = gpu_audit.kernel_resources("cartpole", extra_options=("--maxrregcount=16",))
    assert report["pg_step"]["spill_stores"] > 0
    problems = gpu_audit.resource_problems("cartpole", report)
    assert any("cartpole pg_step: spills registers" in p for p in problems)


@needs_nvrtc
def test_the_resource_check_catches_an_undeclared_stack(tree_copy):
    """The statistics loop bounded by the run-time count (as it once was) indexes the
    caller's values[] at run time: ptxas puts it on the stack and the check names it.
    Then a declaration below the frame is refused too."""
    edit(tree_copy / "native" / "pg_env.h", "s < PG_MAX_STATS && s < k", "s < k")
    problems = gpu_audit.resource_problems("cartpole", gpu_audit.kernel_resources("cartpole"))
    assert any("cartpole pg_step:" in p and "declares none" in p for p in problems), problems
    edit(tree_copy / "cartpole" / "cartpole.h", '#include "pg_env.h"\n',
         '#include "pg_env.h"\nPG_GPU_STACK(8, "a test")\n')
    assert gpu_audit.stack_allowance("cartpole") == (8, "a test")
    problems = gpu_audit.resource_problems("cartpole", gpu_audit.kernel_resources("cartpole"))
    assert any("over the 8 its header declares" in p for p in problems), problems


def test_ptxas_reports_are_parsed_per_kernel():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'pg_reset' for 'sm_90'
ptxas info    : Function properties for pg_reset
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 28 registers, used 0 barriers
ptxas info    : Compiling entry function 'pg_step' for 'sm_90'
ptxas info    : Function properties for pg_step
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 48 registers, used 0 barriers, 16 bytes cumulative stack size"""
    report = gpu_audit.parse_ptxas_report(log)
    assert report == {"pg_reset": {"stack": 0, "spill_stores": 0, "spill_loads": 0,
                                   "registers": 28},
                      "pg_step": {"stack": 16, "spill_stores": 8, "spill_loads": 4,
                                  "registers": 48}}
    problems = gpu_audit.resource_problems("cartpole", report)
    assert len(problems) == 2 and "spills" in problems[0] and "16 bytes" in problems[1]


# ---- launch configuration ------------------------------------------------------------

INSTANCE_INDEX_LIMIT = 2 ** 31 - 1        # the kernels' instance index is an int


@pytest.mark.parametrize("num_envs", [1, 127, 128, 129, 4096, 1 << 20, (1 << 22) + 1,
                                      1 << 26, INSTANCE_INDEX_LIMIT])
def test_launch_gives_every_instance_one_thread_within_cuda_limits(num_envs):
    blocks, threads = gpu.launch_config(num_envs)
    assert threads % 32 == 0 and 32 <= threads <= 1024          # whole warps, CUDA's block cap
    assert 1 <= blocks <= 2 ** 31 - 1                           # CUDA's grid.x cap
    assert blocks * threads >= num_envs > (blocks - 1) * threads  # all covered, no idle block


def test_the_kernels_index_instances_in_64_bits():
    """What the launch test assumes: every kernel (step, reset, the global state's)
    takes the 64-bit index and compares it with num_envs before narrowing it to the
    int the env functions take."""
    source = (gpu.NATIVE_DIR / "pg_gpu.h").read_text()
    kernels = source.count('extern "C" __global__ void')
    assert kernels == 3
    assert "(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x" in source
    assert source.count("pg_thread_index();") == kernels
    assert source.count("if (thread >= (unsigned long long)env->pg.num_envs) return;") == kernels
    assert "(int)(blockIdx.x" not in source


def test_launch_configuration_refuses_what_cuda_or_the_kernel_cannot_run():
    for bad in (0, -1, INSTANCE_INDEX_LIMIT + 1, 2.0, True, "8"):
        with pytest.raises(ValueError, match="num_envs must be an int"):
            gpu.launch_config(bad)
    for bad in (0, 16, 100, 2048):
        with pytest.raises(ValueError, match="threads_per_block must be a multiple of 32"):
            gpu.launch_config(4096, threads_per_block=bad)
    with pytest.raises(RuntimeError, match="at most 64 threads per block"):
        gpu.launch_config(4096, kernel_max_threads=64)
    assert gpu.launch_config(4096, threads_per_block=1024) == (4, 1024)
