"""The short name of an Itanium-mangled kernel name (`_Z...`), read off its leading name.

HIP kernels launched through hipModuleLaunchKernel (aiter, ck_tile, sgl-kernel on ROCm)
reach torch.profiler mangled, where CUDA's arrive demangled. The C++ runtime's own
demangler is no help: the system libstdc++ and binutils of Debian 12 reject clang's newer
manglings in these very names (`DF16b` for bfloat16, `Tn` template parameters). A short
name needs only the leading nested name, whose parts are length-prefixed identifiers:
`_ZN5aiter24add_rmsnorm_quant_kernelIDF16b...` -> `add_rmsnorm_quant_kernel`. As with a
demangled name (kineto.short_name), it is the last part before the first template
arguments.
"""

from __future__ import annotations

#: Qualifiers a nested name may open with (const, volatile, restrict, & and && on `this`).
_QUALIFIERS = "rVKRO"
#: The second letters of the two-letter substitutions (St = std::, Sa = std::allocator, ...).
_ABBREVIATIONS = "tabsiod"


def short_name(name: str) -> str | None:
    """The function's own identifier, or None when `name` is not a mangled function name
    this reads (then the caller keeps the name as it is)."""
    if not name.startswith("_Z"):
        return None
    at = 2
    if name.startswith("L", at):        # internal linkage (a static function)
        at += 1
    nested = name.startswith("N", at)
    if nested:
        at += 1
        while at < len(name) and name[at] in _QUALIFIERS:
            at += 1
    last = None
    while at < len(name):
        if name[at].isdigit():
            digits = at
            while at < len(name) and name[at].isdigit():
                at += 1
            length = int(name[digits:at])
            if length == 0 or at + length > len(name):
                return None
            last, at = name[at:at + length], at + length
        elif nested and name[at] == "S":     # a prefix named before: `St` (std::) and the like, or S_, S0_, ...
            if at + 1 < len(name) and name[at + 1] in _ABBREVIATIONS:
                at += 2
            else:
                end = name.find("_", at)
                if end < 0:
                    return None
                at = end + 1
        else:
            break
        if not nested:
            break
    if last is None or last.startswith("_GLOBAL__N"):
        return None
    return last
