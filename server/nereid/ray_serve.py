"""The documented import path of nereid on Ray Serve; the code lives in ``nereid.ray.serve``."""

from nereid.ray.serve import *  # noqa: F403
from nereid.ray.serve import __all__ as __all__
