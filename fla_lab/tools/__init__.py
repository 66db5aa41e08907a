"""The diagnostic tools: the NaN locator (hunt), the stability atlas, the audit, FLA model audits, the doctor, figures
and widgets.

Submodules load on first use (`fla_lab.tools.<module>`)."""
from fla_lab.runtime import submodule_getattr

__getattr__ = submodule_getattr(__name__)
