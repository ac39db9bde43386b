"""The config lookup service: a FastAPI app over the result store.

`create_app` builds the app; `kerneltune serve` (see `kerneltune.api.cli`) runs it.
"""

from kerneltune.api.app import create_app
from kerneltune.api.settings import Settings

__all__ = ["Settings", "create_app"]
