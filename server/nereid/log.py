"""Logging setup for the ``nereid`` logger from --log-verbose and friends.

Called by the CLI and the server only, never at import time.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_logging", "LOGGER_NAME"]

LOGGER_NAME = "nereid"
_FORMATS = {
    "default": "%(levelname).1s%(asctime)s.%(msecs)03d %(process)d %(name)s] %(message)s",
    "ISO8601": "%(asctime)s %(levelname)s %(process)d %(name)s] %(message)s",
}
_DATEFMT = {"default": "%m%d %H:%M:%S", "ISO8601": "%Y-%m-%dT%H:%M:%S"}


def configure_logging(verbose: int = 0, fmt: str = "default") -> logging.Logger:
    """Attach one stderr handler to the ``nereid`` logger (idempotent) and set its level:
    INFO by default, DEBUG when ``verbose >= 1``."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = next((h for h in logger.handlers if getattr(h, "_nereid", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._nereid = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    handler.setFormatter(logging.Formatter(_FORMATS.get(fmt, _FORMATS["default"]), _DATEFMT.get(fmt)))
    logger.setLevel(logging.DEBUG if verbose >= 1 else logging.INFO)
    return logger
