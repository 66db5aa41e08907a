"""The spec layer: the float64 references, the checks, the op registry and its inputs, the safeguards and markers, FLA's
ops in the registry's terms.

Submodules load on first use (`fla_lab.spec.<module>`)."""
from fla_lab.runtime import submodule_getattr

__getattr__ = submodule_getattr(__name__)
