"""attnprof: profile attention in PyTorch and say what each implementation does on the GPU.

The public surface for plugins is `Variant` and `RunSpec`; a plugin's
`register_variants(register)` calls `register(Variant(...))`.
"""

from attnprof.registry import RunSpec, Variant

__version__ = "0.1.0"
__all__ = ["RunSpec", "Variant", "__version__"]
