"""Checks of the GPU build that need no GPU: the Env struct's layout and the kernels' resources.

The GPU batch builds the Env struct on the host (the CPU binding's env_init) and
uploads it byte for byte (gpu/batch.py), so the struct NVRTC compiles must have the
host compiler's layout exactly: a field that sits elsewhere on the device would be
read as silent garbage. `check_layout(name)` proves it per env:

1. the field list comes from the host compiler itself: the env header is compiled
   with `-g` and every member of `struct Env` (nested structs and the first
   element of arrays of structs included) is read from the DWARF debug
   information (`readelf`), so no list of fields is kept by hand;
2. that one list becomes one array of `sizeof`/`__alignof__`/offset expressions
   (`__builtin_offsetof` on the host; under NVRTC, which lacks it in some
   releases, the address difference from a null Env), compiled by the host C
   compiler (a small program prints it) and by NVRTC (a `__device__` constant
   array, read back from the PTX text);
3. the two arrays must be equal.

`kernel_resources(name)` compiles the kernels to a cubin for `sm_90` with ptxas'
verbose report (registers, stack frame, spill stores/loads per kernel) and
`resource_problems` turns it into failures: any spill, or a local-memory stack in
the step kernel that the env's header does not declare with
`PG_GPU_STACK(max_bytes, "why")` (pg_env.h).

    python -m peregrine.envs.gpu.audit            # every env: layout + resource table
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import sdk
from . import compiler

# The GPU target whose resources are recorded: the H100 (compute capability 9.0).
RESOURCE_ARCH = "sm_90"
KERNELS = ("pg_step", "pg_reset")
# The language options that decide the layout in the CPU build (setup.py's
# compile_args; optimisation and warning flags do not move fields).
HOST_LAYOUT_FLAGS = ("-std=c11", "-D_GNU_SOURCE")
LAYOUT_SYMBOL = "pg_layout_probe"


class LayoutToolMissing(RuntimeError):
    """No host C compiler or readelf: the layout cannot be read on this machine."""


def host_compiler() -> str:
    """The C compiler the SDK builds env headers with (envs/sdk.py: CC, Python's own,
    cc, gcc, clang); LayoutToolMissing when there is none."""
    try:
        return sdk.compiler()
    except sdk.NativeBuildError as missing:
        raise LayoutToolMissing(str(missing)) from None


def _host_include_flags(name: str) -> list[str]:
    return [f"-I{path}" for path in compiler._include_dirs(name)]


# ---- 1. the field list, from the host compiler's debug information -----------------

_DIE = re.compile(r"^\s*<(\d+)><([0-9a-f]+)>: Abbrev Number: \d+ \((DW_TAG_\w+)\)")
_ATTRIBUTE = re.compile(r"^\s*<[0-9a-f]+>\s+(DW_AT_\w+)\s*:\s*(.*)$")


def _parse_dwarf(text: str) -> dict[int, dict]:
    """readelf --debug-dump=info text -> {offset: {tag, depth, attrs, children}}."""
    entries: dict[int, dict] = {}
    stack: list[int] = []
    current = None
    for line in text.splitlines():
        die = _DIE.match(line)
        if die:
            depth, offset, tag = int(die.group(1)), int(die.group(2), 16), die.group(3)
            current = {"tag": tag, "depth": depth, "attrs": {}, "children": []}
            entries[offset] = current
            del stack[depth:]
            if stack:
                entries[stack[-1]]["children"].append(offset)
            stack.append(offset)
            continue
        attribute = _ATTRIBUTE.match(line)
        if attribute and current is not None:
            value = attribute.group(2).strip()
            if value.startswith("(indirect") and "):" in value:
                value = value.rsplit("):", 1)[1].strip()
            current["attrs"][attribute.group(1)] = value
    return entries


def _type_of(entries, entry) -> dict | None:
    reference = entry["attrs"].get("DW_AT_type")
    if not reference:
        return None
    return entries[int(reference.strip("<>"), 16)]


def _strip_qualifiers(entries, entry):
    while entry is not None and entry["tag"] in ("DW_TAG_typedef", "DW_TAG_const_type",
                                                  "DW_TAG_volatile_type",
                                                  "DW_TAG_atomic_type"):
        entry = _type_of(entries, entry)
    return entry


def _members(entries, structure, prefix: str) -> list[tuple[str, dict | None]]:
    """Every member of `structure` as (C member designator such as a.b or a[0].c,
    its type's entry with typedefs and qualifiers stripped)."""
    members = []
    for child in structure["children"]:
        member = entries[child]
        if member["tag"] != "DW_TAG_member":
            continue
        name = member["attrs"].get("DW_AT_name")
        kind = _strip_qualifiers(entries, _type_of(entries, member))
        if name is None:                       # an anonymous struct/union: its members
            if kind is not None and kind["tag"] in ("DW_TAG_structure_type",
                                                    "DW_TAG_union_type"):
                members += _members(entries, kind, prefix)
            continue
        path = prefix + name
        members.append((path, kind))
        if kind is None:
            continue
        if kind["tag"] in ("DW_TAG_structure_type", "DW_TAG_union_type"):
            members += _members(entries, kind, path + ".")
        elif kind["tag"] == "DW_TAG_array_type":
            element = _strip_qualifiers(entries, _type_of(entries, kind))
            index = "[0]" * sum(entries[c]["tag"] == "DW_TAG_subrange_type"
                                for c in kind["children"])
            if element is not None and element["tag"] in ("DW_TAG_structure_type",
                                                          "DW_TAG_union_type"):
                members += _members(entries, element, path + index + ".")
    return members


def _member_paths(entries, structure, prefix: str) -> list[str]:
    """Every member of `structure` as a C member designator (a.b, a[0].c)."""
    return [path for path, _ in _members(entries, structure, prefix)]


def _env_members(name: str) -> tuple[dict[int, dict], list[tuple[str, dict | None]]]:
    """(the debug-information entries, `_members` of env `name`'s struct Env)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        raise LayoutToolMissing("readelf (binutils) is not installed")
    cc = host_compiler()
    with tempfile.TemporaryDirectory(prefix="pg-layout-") as scratch:
        source, objfile = Path(scratch) / "probe.c", Path(scratch) / "probe.o"
        source.write_text(f'{compiler.header_include(name)}\nEnv {LAYOUT_SYMBOL};\n')
        _run([cc, *HOST_LAYOUT_FLAGS, "-g", "-w", "-c", *_host_include_flags(name),
              str(source), "-o", str(objfile)], f"compiling the {name} header with debug info")
        text = _run([readelf, "--debug-dump=info", str(objfile)], "readelf")
    entries = _parse_dwarf(text)
    structures = [entry for entry in entries.values()
                  if entry["tag"] == "DW_TAG_structure_type"
                  and entry["attrs"].get("DW_AT_name") == "Env" and entry["children"]]
    if len(structures) != 1:
        raise RuntimeError(f"expected one definition of struct Env in the {name} header's "
                           f"debug information, found {len(structures)}")
    return entries, _members(entries, structures[0], "")


def env_fields(name: str) -> list[str]:
    """Every member of env `name`'s `struct Env`, as the host compiler sees it."""
    return [path for path, _ in _env_members(name)[1]]


def pointer_problems(name: str, env_class) -> list[str]:
    """The GPU batch uploads the Env struct with every pg_alloc array's pointer and
    every PgBatch buffer's pointer replaced by its device copy's; any other pointer
    member would reach the GPU as a host address. Each pointer member of `struct
    Env` (from the debug information) must sit at one of those offsets (from the
    binding's `layout()` of a default-config batch of `env_class`, the env's
    NativeEnv class); an array of pointers cannot be mirrored at all."""
    entries, members = _env_members(name)

    def tag(kind):
        return None if kind is None else kind["tag"]
    pointers = [path for path, kind in members if tag(kind) == "DW_TAG_pointer_type"]
    problems = [f"{path}: an array of pointers cannot be mirrored on the GPU"
                for path, kind in members if tag(kind) == "DW_TAG_array_type"
                and tag(_strip_qualifiers(entries, _type_of(entries, kind)))
                == "DW_TAG_pointer_type"]
    offsets = host_layout(name, [(path, f"PG_LAYOUT_OFFSETOF(Env, {path})")
                                 for path in pointers]) if pointers else []
    env = env_class(num_envs=1)
    try:
        layout = env._batch.layout()
    finally:
        env.close()
    mirrored = {offset for offset, _ in layout["allocations"]} | set(layout["buffers"].values())
    problems += [f"{path} (byte {offset}) is a pointer not allocated with PG_ALLOC: the GPU "
                 "build cannot mirror it (see pg_env.h)"
                 for path, offset in zip(pointers, offsets) if offset not in mirrored]
    return problems


def _run(command: list[str], what: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(command[:2])} ...):\n{result.stderr}")
    return result.stdout


# ---- 2. one list of expressions, two compilers -------------------------------------

def layout_expressions(fields: list[str]) -> list[tuple[str, str]]:
    """(label, C expression) pairs: the struct's size and alignment, then each
    field's offset and size."""
    rows = [("sizeof(Env)", "sizeof(Env)"), ("alignof(Env)", "__alignof__(Env)")]
    for path in fields:
        rows.append((f"offsetof({path})", f"PG_LAYOUT_OFFSETOF(Env, {path})"))
        rows.append((f"sizeof({path})", f"sizeof(((Env *)0)->{path})"))
    return rows


# The host compiler's own offsetof; NVRTC has no <stddef.h> and some releases
# (13.0) no __builtin_offsetof either, so on the GPU side the offset is the
# address difference from a null Env, which NVRTC folds to a constant.
_HOST_OFFSETOF = "#define PG_LAYOUT_OFFSETOF(T, m) __builtin_offsetof(T, m)\n"
_DEVICE_OFFSETOF = ("#define PG_LAYOUT_OFFSETOF(T, m) "
                    "((char *)&(((T *)0)->m) - (char *)0)\n")


def _initializer(rows) -> str:
    return ",\n    ".join(f"(unsigned long long)({expression})" for _, expression in rows)


def host_layout(name: str, rows) -> list[int]:
    """The expressions' values as the host C compiler lays the struct out."""
    cc = host_compiler()
    with tempfile.TemporaryDirectory(prefix="pg-layout-") as scratch:
        source, program = Path(scratch) / "layout.c", Path(scratch) / "layout"
        source.write_text(f'{compiler.header_include(name)}\n' + _HOST_OFFSETOF +
                          f"static const unsigned long long pg_layout[] = {{\n    "
                          f"{_initializer(rows)}\n}};\n"
                          "int main(void) {\n"
                          "    for (size_t i = 0; i < sizeof pg_layout / sizeof pg_layout[0]; "
                          "i++)\n"
                          '        printf("%llu\\n", pg_layout[i]);\n'
                          "    return 0;\n}\n")
        _run([cc, *HOST_LAYOUT_FLAGS, "-w", *_host_include_flags(name), str(source),
              "-o", str(program), "-lm"], f"compiling the {name} layout program")
        output = _run([str(program)], f"running the {name} layout program")
    return [int(line) for line in output.split()]


_PTX_ARRAY = re.compile(r"\.global\s+\.align\s+\d+\s+\.(b8|u64|b64)\s+pg_layout\[(\d+)\]"
                        r"(?:\s*=\s*\{([^}]*)\})?\s*;")


def device_layout(name: str, rows, arch: str = compiler.CHECK_ARCH) -> list[int]:
    """The same expressions compiled by NVRTC into the GPU translation unit (the
    env header and the kernels) as a `__device__` constant array, read back from
    the PTX."""
    source = (compiler.kernel_source(name) + _DEVICE_OFFSETOF +
              f'extern "C" __device__ const unsigned long long pg_layout[{len(rows)}] = {{\n'
              f"    {_initializer(rows)}\n}};\n")
    ptx = compiler.compile_source(name, source, "ptx", arch)[0].decode(errors="replace")
    return parse_ptx_array(ptx, len(rows))


def parse_ptx_array(ptx: str, count: int) -> list[int]:
    """The `pg_layout` array of `count` 64-bit values from PTX text (NVRTC writes
    a byte array, little-endian, and leaves trailing zeros out)."""
    match = _PTX_ARRAY.search(ptx)
    if match is None:
        raise RuntimeError("the PTX holds no pg_layout array")
    kind, length, body = match.group(1), int(match.group(2)), match.group(3) or ""
    values = [int(token, 0) for token in body.replace("\n", " ").split(",") if token.strip()]
    if kind == "b8":
        data = bytes(values) + bytes(length - len(values))
        words = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
    else:
        words = values + [0] * (length - len(values))
    if len(words) != count:
        raise RuntimeError(f"pg_layout has {len(words)} values in the PTX, expected {count}")
    return words


@dataclass
class LayoutReport:
    name: str
    fields: list[str]
    rows: list[tuple[str, str]]
    host: list[int]
    device: list[int]
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def size(self) -> int:
        return self.host[0]


def check_layout(name: str, arch: str = compiler.CHECK_ARCH) -> LayoutReport:
    """Host and NVRTC layouts of env `name`'s Env struct, compared."""
    fields = env_fields(name)
    rows = layout_expressions(fields)
    host, device = host_layout(name, rows), device_layout(name, rows, arch)
    report = LayoutReport(name, fields, rows, host, device)
    for (label, _), mine, theirs in zip(rows, host, device):
        if mine != theirs:
            report.mismatches.append(f"{label}: host {mine}, NVRTC {theirs}")
    return report


# ---- kernel resources (ptxas) ------------------------------------------------------

_FUNCTION = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v's report -> {kernel: {registers, stack, spill_stores, spill_loads}}."""
    kernels: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        function = _FUNCTION.search(line)
        if function:
            current = kernels.setdefault(function.group(1), {})
            continue
        if current is None:
            continue
        frame = _FRAME.search(line)
        if frame:
            current.update(stack=int(frame.group(1)), spill_stores=int(frame.group(2)),
                           spill_loads=int(frame.group(3)))
        used = _USED.search(line)
        if used:
            current["registers"] = int(used.group(1))
    return kernels


def kernel_resources(name: str, arch: str = RESOURCE_ARCH,
                     extra_options: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
    """Compiles env `name`'s kernels to a cubin for `arch` with ptxas' verbose
    report; {kernel: {registers, stack, spill_stores, spill_loads}}."""
    _, log = compiler.compile_source(name, compiler.kernel_source(name), "cubin", arch,
                                ("--ptxas-options=-v", *extra_options))
    report = parse_ptxas_report(log)
    missing = [kernel for kernel in KERNELS
               if set(report.get(kernel, {})) != {"registers", "stack", "spill_stores",
                                                   "spill_loads"}]
    if missing:
        raise RuntimeError(f"ptxas reported no resources for {', '.join(missing)} of {name}; "
                           f"its log:\n{log}")
    return report


_STACK_NOTE = re.compile(r'^\s*PG_GPU_STACK\(\s*(\d+)\s*,\s*"((?:[^"\\]|\\.)+)"\s*\)', re.M)


def stack_allowance(name: str) -> tuple[int, str] | None:
    """(max bytes, reason) from the env header's `PG_GPU_STACK(max_bytes, "why")`,
    or None: the step kernel must then run without a local-memory stack."""
    notes = _STACK_NOTE.findall(compiler.header_path(name).read_text())
    if len(notes) > 1:
        raise ValueError(f"the {name} header declares PG_GPU_STACK {len(notes)} times")
    return (int(notes[0][0]), notes[0][1]) if notes else None


def resource_problems(name: str, report: dict[str, dict[str, int]]) -> list[str]:
    """Failures in a ptxas report: any spill in either kernel; a stack frame in
    the step kernel beyond what the header declares (none by default)."""
    problems = []
    for kernel in KERNELS:
        usage = report[kernel]
        if usage["spill_stores"] or usage["spill_loads"]:
            problems.append(f"{name} {kernel}: spills registers ({usage['spill_stores']} bytes "
                            f"stored, {usage['spill_loads']} loaded)")
    stack = report["pg_step"]["stack"]
    allowance = stack_allowance(name)
    allowed = allowance[0] if allowance else 0
    if stack > allowed:
        problems.append(
            f"{name} pg_step: {stack} bytes of local-memory stack per thread, "
            + (f"over the {allowed} its header declares (PG_GPU_STACK)" if allowance else
               "and its header declares none (PG_GPU_STACK(max_bytes, \"why\") in the env "
               "header, or keep per-thread arrays small and constant-indexed)"))
    return problems


def resource_table(names, arch: str = RESOURCE_ARCH) -> str:
    """A Markdown table of every kernel's resources, for RESULTS."""
    lines = ["| env | kernel | registers | stack (bytes) | spill stores | spill loads | "
             "declared stack |",
             "|---|---|---:|---:|---:|---:|---|"]
    for name in names:
        report = kernel_resources(name, arch)
        allowance = stack_allowance(name)
        for kernel in KERNELS:
            usage = report[kernel]
            declared = (f"{allowance[0]}" if allowance and kernel == "pg_step" else "")
            lines.append(f"| {name} | {kernel} | {usage['registers']} | {usage['stack']} | "
                         f"{usage['spill_stores']} | {usage['spill_loads']} | {declared} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs", nargs="*")
    parser.add_argument("--arch", default=RESOURCE_ARCH)
    args = parser.parse_args(argv)
    names = args.envs or compiler.header_names()
    print(f"NVRTC {'.'.join(map(str, compiler.nvrtc_version()))}, {args.arch}\n")
    failed = False
    for name in names:
        layout = check_layout(name)
        problems = resource_problems(name, kernel_resources(name, args.arch))
        print(f"{name}: Env {layout.size} bytes, {len(layout.fields)} fields, layout "
              + ("identical" if layout.ok else "DIFFERS: " + "; ".join(layout.mismatches)))
        for problem in problems:
            print(f"  {problem}")
        failed |= not layout.ok or bool(problems)
    print()
    print(resource_table(names, args.arch))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
