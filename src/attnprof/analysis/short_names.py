"""Short kernel names: `short_kernel_name(name)` strips `void`, template arguments, function arguments and
namespaces (`void pytorch_flash::flash_fwd_kernel<...>(...)` -> `flash_fwd_kernel`)."""

from __future__ import annotations

import re
from functools import lru_cache

ANON = "(anonymous namespace)"
_WRAPPERS = re.compile(r"^(?:Kernel\d*|device_kernel|enable_sm\w*|kernel)$")
_NAME = re.compile(r"^[A-Za-z_]\w*(?:<[^<>]*>)?$")  # a kernel name, not a type, number or expression
_NOT_NAMES = frozenset(
    {"int", "unsigned", "long", "short", "char", "bool", "float", "double", "half", "void", "true", "false", "size_t"}
)
_HINTED = frozenset(
    {
        "vectorized_elementwise_kernel",
        "unrolled_elementwise_kernel",
        "elementwise_kernel",
        "elementwise_kernel_with_index",
        "index_elementwise_kernel",
        "reduce_kernel",
    }
)
_CALL_HINT = re.compile(r"([A-Za-z_]\w*)\((?!\))")
_FUNCTOR_HINT = re.compile(r"(\w*Functor\w*)")
_GENERIC = frozenset(
    {
        "lambda",
        "operator",
        "gpu_kernel_impl",
        "gpu_kernel_impl_nocast",
        "launch_kernel",
        "AUnaryFunctor",
        "BUnaryFunctor",
        "BinaryFunctor",
        "UnaryFunctor",
        "func_wrapper_t",
    }
)


def _split_top(text: str) -> tuple[str, str]:
    """Split `ns::name<targs>(args)` into the name path with templates removed and the text of
    its first top-level template argument list ('' if none). `<` and `>` inside parentheses within
    the template arguments (`<(N > 0)>`) are no brackets."""
    out: list[str] = []
    targs: list[str] = []
    depth_angle = depth_paren = inner_paren = 0
    i, n = 0, len(text)
    first_targs_done = False
    while i < n:
        if text.startswith(ANON, i) and depth_angle == 0 and depth_paren == 0:
            out.append(ANON)
            i += len(ANON)
            continue
        ch = text[i]
        bracket = depth_paren == 0 and inner_paren == 0
        if depth_angle > 0 and ch in "()":
            inner_paren += 1 if ch == "(" else -1
            if not first_targs_done:
                targs.append(ch)
        elif bracket and ch == "<" and not text.startswith("<<", i):
            depth_angle += 1
            if depth_angle > 1 and not first_targs_done:
                targs.append(ch)
        elif bracket and ch == ">" and depth_angle > 0:
            depth_angle -= 1
            if depth_angle == 0:
                first_targs_done = True
            elif not first_targs_done:
                targs.append(ch)
        elif depth_angle == 0 and ch == "(":
            break  # the function's parameter list: the name ended
        elif depth_angle == 0:
            out.append(ch)
        elif not first_targs_done:
            targs.append(ch)
        i += 1
    return "".join(out).strip(), "".join(targs)


def _strip_return_type(text: str) -> str:
    """`text` from its function name on: a return type before it (`std::enable_if<...>::type ns::kernel<...>(...)`)
    is cut off. The name starts after the last space outside brackets and parentheses before its
    parameter list."""
    depth = paren = 0
    start, i, n = 0, 0, len(text)
    while i < n:
        if text.startswith(ANON, i) and depth == 0 and paren == 0:
            i += len(ANON)
            continue
        ch = text[i]
        if ch == "(":
            if depth == 0 and paren == 0:
                break
            paren += 1
        elif ch == ")":
            paren -= 1
        elif paren == 0 and ch == "<" and not text.startswith("<<", i):
            depth += 1
        elif paren == 0 and ch == ">" and depth > 0:
            depth -= 1
        elif ch == " " and depth == 0 and paren == 0:
            start = i + 1
        i += 1
    return text[start:]


def _first_targ(targs: str) -> str:
    depth = 0
    for i, ch in enumerate(targs):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            return targs[:i].strip()
    return targs.strip()


@lru_cache(maxsize=8192)
def short_kernel_name(name: str) -> str:
    """A readable short form of a kernel name (see module docstring)."""
    return _short(name, 0)


def _short(name: str, _depth: int) -> str:
    text = name.strip()
    if text.startswith("void "):
        text = text[5:].lstrip()
    if text.startswith(("Memcpy ", "Memset ")):
        return text.split(" (", 1)[0]
    path, targs = _split_top(_strip_return_type(text))
    base = path.split("::")[-1].strip() if path else ""
    if not base:
        return name.strip()
    if _WRAPPERS.match(base):
        inner = _short(_first_targ(targs), _depth + 1) if targs and _depth < 4 else ""
        if _NAME.match(inner) and inner not in _NOT_NAMES:
            return inner
        parts = [p.strip() for p in path.split("::") if p.strip()]
        return "::".join(parts[-2:])  # `gemvx::kernel`: a generic name keeps its namespace
    if base in _HINTED and targs:
        hint = next((m for m in _CALL_HINT.findall(targs) if m not in _GENERIC), None)
        if hint is None:
            hint = next((m for m in _FUNCTOR_HINT.findall(targs) if m not in _GENERIC), None)
        if hint:
            return f"{base}<{hint}>"
    return base
