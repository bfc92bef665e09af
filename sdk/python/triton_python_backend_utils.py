"""Triton's module name for its Python-backend API, so that `import triton_python_backend_utils
as pb_utils` works unchanged in a Wisp plugin (it is `wisp`)."""
from wisp import *  # noqa: F401,F403
from wisp import __all__  # noqa: F401
