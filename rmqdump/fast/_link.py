"""Link numba-compiled entry points into one shared library (used by the kernel modules' builds).

Run in a process whose numba cache is empty: the LLVM IR of every entry point must be fresh
(code loaded from numba's cache has no IR to link).
"""

from __future__ import annotations

import os
import subprocess
import tempfile

#: numba runtime helpers the kernels reference but never call (stand-ins that abort)
KNOWN_HELPERS = ("NRT_Free", "NRT_MemInfo_call_dtor", "numba_do_raise", "numba_gil_ensure", "numba_gil_release",
                 "numba_runtime_build_excinfo_struct", "numba_unpickle")


def pointer_intrinsic(nbtype):
    """A numba intrinsic: int64 address -> typed pointer (how the C entry points read their argument block)."""
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def as_pointer(typingctx, addr):
        sig = types.CPointer(nbtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return as_pointer


def stub_source(names) -> str:
    return "#include <stdlib.h>\n" + "".join(f"void {n}(void) {{ abort(); }}\n" for n in sorted(set(names)))


def link_shared_library(entry_points: dict, path: str, cc: str = "cc", label: str = "kernels") -> None:
    """Compile ``{export name: numba cfunc}`` into one position-independent object for this CPU and
    link ``path`` with the C compiler ``cc`` (helper stand-ins included); atomic replace. Raises on failure."""
    from llvmlite import binding as ll

    modules = []
    for export, fn in entry_points.items():
        mod = ll.parse_assembly(str(fn._library._final_module))
        target = mod.get_function(fn.native_name)
        if target.is_declaration:
            raise RuntimeError(f"{export}: compiled code came from numba's cache; build with an empty cache")
        target.name = export
        modules.append(mod)
    main = modules[0]
    for m in modules[1:]:
        main.link_in(m)
    for f in main.functions:  # everything must be defined here: no code may live in numba's cache
        if f.is_declaration and f.name.startswith("_ZN"):
            raise RuntimeError(f"{f.name} is not defined in the module (loaded from numba's cache)")
    target = ll.Target.from_triple(ll.get_process_triple())
    tm = target.create_target_machine(cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(),
                                      opt=3, reloc="pic", codemodel="default")
    main.triple = tm.triple
    obj = tm.emit_object(main)
    with tempfile.TemporaryDirectory(prefix="rmqdump-build-") as tmp:
        o = os.path.join(tmp, f"{label}.o")
        with open(o, "wb") as f:
            f.write(obj)
        names = list(KNOWN_HELPERS)
        try:
            nm = subprocess.run(["nm", "-u", o], capture_output=True, text=True, timeout=60)
            names += [ln.split()[-1] for ln in nm.stdout.splitlines()
                      if ln.split()[-1:] and ln.split()[-1].startswith(("numba_", "NRT_"))]
        except OSError:
            pass
        stubs = os.path.join(tmp, "stubs.c")
        with open(stubs, "w") as f:
            f.write(stub_source(names))
        out = os.path.join(tmp, f"{label}.so")
        res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", out, o, stubs], capture_output=True, text=True)
        if res.returncode != 0:
            raise OSError(f"linking the {label} failed: {res.stderr.strip()[:500]}")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd, tmp_out = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{label}-", suffix=".so")
        os.close(fd)
        with open(out, "rb") as src, open(tmp_out, "wb") as dst:
            dst.write(src.read())
        os.chmod(tmp_out, 0o755)
        os.replace(tmp_out, path)
