"""Logging setup for the ``nereid`` logger from --log-verbose and friends, and the
run-time log settings of Triton's logging extension (``/v2/logging``).

Called by the CLI, the server and the logging endpoint only, never at import time.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

__all__ = ["configure_logging", "LOGGER_NAME", "LOG_FORMATS", "LogSettings", "log_settings", "apply_log_settings"]

LOGGER_NAME = "nereid"
_FORMATS = {
    "default": "%(levelname).1s%(asctime)s.%(msecs)03d %(process)d %(name)s] %(message)s",
    "ISO8601": "%(asctime)s %(levelname)s %(process)d %(name)s] %(message)s",
}
_DATEFMT = {"default": "%m%d %H:%M:%S", "ISO8601": "%Y-%m-%dT%H:%M:%S"}
#: The log formats tritonserver accepts (``--log-format``, ``/v2/logging``).
LOG_FORMATS = tuple(_FORMATS)


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Triton's log settings (``GET /v2/logging``): independent switches for info,
    warning and error lines, a verbose level (>= 1 shows DEBUG lines) and the format.
    ``log_file`` is always "" (nereid logs to stderr)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"


class _SettingsFilter(logging.Filter):
    """Drops records whose kind is switched off; holds the current settings."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self.settings
        level = record.levelno
        if level >= logging.ERROR:
            return settings.log_error
        if level >= logging.WARNING:
            return settings.log_warning
        if level >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0


def _handler() -> logging.Handler | None:
    logger = logging.getLogger(LOGGER_NAME)
    return next((h for h in logger.handlers if getattr(h, "_nereid", False)), None)


def configure_logging(
    verbose: int = 0, fmt: str = "default", *, info: bool = True, warning: bool = True, error: bool = True
) -> logging.Logger:
    """Attach one stderr handler to the ``nereid`` logger (idempotent) and apply the
    settings: INFO and up by default, DEBUG too when ``verbose >= 1``; ``info``,
    ``warning`` and ``error`` switch those lines on or off."""
    apply_log_settings(
        LogSettings(log_info=info, log_warning=warning, log_error=error, log_verbose_level=verbose, log_format=fmt)
    )
    return logging.getLogger(LOGGER_NAME)


def log_settings() -> LogSettings:
    """The settings in force (defaults before logging is configured)."""
    handler = _handler()
    if handler is None:
        return LogSettings()
    for item in handler.filters:
        if isinstance(item, _SettingsFilter):
            return item.settings
    return LogSettings()


def apply_log_settings(settings: LogSettings) -> None:
    """Make ``settings`` current for the ``nereid`` logger (creating its stderr handler
    if needed). The logger is process-wide, as logging is; call from the CLI/server or
    the ``/v2/logging`` handler only."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = _handler()
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._nereid = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    fmt = settings.log_format if settings.log_format in _FORMATS else "default"
    handler.setFormatter(logging.Formatter(_FORMATS[fmt], _DATEFMT[fmt]))
    current = next((f for f in handler.filters if isinstance(f, _SettingsFilter)), None)
    if current is None:
        handler.addFilter(_SettingsFilter(settings))
    else:
        current.settings = settings
    logger.setLevel(logging.DEBUG if settings.log_verbose_level >= 1 else logging.INFO)
