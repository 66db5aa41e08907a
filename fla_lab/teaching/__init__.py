"""The teaching layer: the bug catalogue, the learner's edition, exercises and their checks, the prose checks, one
lesson module per notebook.

Submodules load on first use (`fla_lab.teaching.<module>`)."""
from fla_lab.runtime import submodule_getattr

__getattr__ = submodule_getattr(__name__)
