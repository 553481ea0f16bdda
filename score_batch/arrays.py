"""pyarrow in a process that makes no pandas objects: no pandas import (~0.3 s) for pa.array's duck-typing."""

from __future__ import annotations

import sys

import pyarrow as pa


def pyarrow_without_pandas() -> None:
    """Settle pyarrow's lazy pandas check (on pa.array's first call) as "not installed"; to_pandas and
    from_pandas still import it (pyarrow tries again for those). No-op once pandas is imported."""
    if "pandas" in sys.modules:
        return
    refuse = _RefusePandas()
    sys.meta_path.insert(0, refuse)  # `import pandas` raises ModuleNotFoundError meanwhile
    try:
        pa.array([])  # the shim's first check (it cannot raise) records pandas as missing
    except ImportError:
        pass
    finally:
        sys.meta_path.remove(refuse)


class _RefusePandas:
    """A meta path finder that finds no pandas."""

    def find_spec(self, name: str, path=None, target=None):
        """Refuse pandas itself; leave every other module to the next finder."""
        if name == "pandas":
            raise ModuleNotFoundError("pandas is not imported by score-batch's run", name="pandas")
        return None
