"""Import one model.py by path and find its ``Model`` class.

Owns user-code import: a unique module name per model version, sibling modules resolved
inside the model folder, no ``sys.path`` changes. Knows nothing about instances or HTTP.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import itertools
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nereid.errors import ModelLoadError
from nereid.faults import FaultLog, describe_exception
from nereid.triton_python.adapter import install_pb_utils, is_triton_model

__all__ = ["ModelClass", "load_model_class", "unload_model_module", "describe_exception"]

_PACKAGE_PREFIX = "_nereid_models"
# Process-wide on purpose, as sys.modules is (one interpreter, whatever the servers in it):
# a unique package name per import, whichever server imports.
_counter = itertools.count()
# Imports of different models are serialised: the sibling finder is installed on the
# global sys.meta_path while one model file executes.
_import_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class ModelClass:
    """A user's ``Model`` class and what nereid learned about it at import."""

    cls: type
    module: types.ModuleType
    path: Path
    infer_is_async: bool
    infer_is_generator: bool
    #: ``infer(self, inputs, parameters)``: the model also wants the request parameters.
    infer_takes_parameters: bool
    has_batch_size: bool
    has_close: bool
    #: ``__init__(self, context)``; False for a Model without an ``__init__`` of its own
    #: (or one taking only ``self``): it is built with no arguments.
    init_takes_context: bool = True
    #: a Triton Python-backend ``TritonPythonModel`` (``cls``), run through
    #: ``triton_python.adapter.TritonModel``
    triton: bool = False


class _SiblingFinder(importlib.abc.MetaPathFinder):
    """Resolves a plain ``import helper`` from model.py to ``helper.py`` beside it.

    The module is registered under the model's private package (``<pkg>.helper``), so two
    models may each have a ``helper.py`` without clashing; the plain name is removed from
    ``sys.modules`` once model.py has finished executing.
    """

    def __init__(self, folder: Path, package: str) -> None:
        self.folder = folder
        self.package = package
        self.loaded: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or "." in fullname:
            return None
        as_file = self.folder / f"{fullname}.py"
        as_package = self.folder / fullname / "__init__.py"
        if as_file.is_file():
            spec = importlib.util.spec_from_file_location(fullname, as_file)
        elif as_package.is_file():
            spec = importlib.util.spec_from_file_location(
                fullname, as_package, submodule_search_locations=[str(as_package.parent)]
            )
        else:
            return None
        self.loaded.append(fullname)
        return spec


def load_model_class(
    model_file: Path, model_name: str, version: int | None = None, faults: FaultLog | None = None
) -> ModelClass:
    """Import ``model_file`` under a fresh module name and return its ``Model`` class.

    Raises ModelLoadError with a reason naming the file for a missing file, an import
    error (its traceback goes to ``faults``, the server's fault log, or else a log of its
    own; the reason is its message), a missing
    ``Model`` class, or a ``Model`` without a callable ``infer``.
    """
    if not model_file.is_file():
        raise ModelLoadError(model_name, f"{model_file}: model file not found", str(model_file))
    module = _import(model_file, model_name, version, faults if faults is not None else FaultLog())
    return _model_class_of(module, model_file, model_name)


def _import(model_file: Path, model_name: str, version: int | None, faults: FaultLog) -> types.ModuleType:
    """``model_file`` imported under a fresh package (its sibling modules under it too)."""
    package = f"{_PACKAGE_PREFIX}.{_safe(model_name)}_{next(_counter)}"
    module_name = f"{package}.{model_file.stem}"
    with _import_lock:
        _ensure_package(_PACKAGE_PREFIX, None)
        _ensure_package(package, model_file.parent)
        spec = importlib.util.spec_from_file_location(module_name, model_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        finder = _SiblingFinder(model_file.parent, package)
        sys.meta_path.insert(0, finder)
        install_pb_utils()  # a Triton Python-backend model imports triton_python_backend_utils
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            faults.record(model_name, version, "import", exc)
            raise ModelLoadError(
                model_name, f"{model_file}: import failed: {type(exc).__name__}: {exc}", str(model_file)
            ) from exc
        finally:
            sys.meta_path.remove(finder)
            for name in finder.loaded:
                sibling = sys.modules.pop(name, None)
                if sibling is not None:
                    sys.modules[f"{package}.{name}"] = sibling
    return module


def _model_class_of(module: types.ModuleType, model_file: Path, model_name: str) -> ModelClass:
    """The imported module's ``Model`` (or Triton's ``TritonPythonModel``) class, and what
    its methods are like."""
    cls = getattr(module, "Model", None)
    if not isinstance(cls, type) and is_triton_model(module):
        triton_class = module.TritonPythonModel
        if not callable(getattr(triton_class, "execute", None)):
            raise ModelLoadError(
                model_name, f"{model_file}: class TritonPythonModel has no method 'execute'", str(model_file)
            )
        return ModelClass(
            cls=triton_class, module=module, path=model_file, infer_is_async=False, infer_is_generator=False,
            infer_takes_parameters=False, has_batch_size=False, has_close=True, triton=True,
        )
    if not isinstance(cls, type):
        raise ModelLoadError(
            model_name, f"{model_file}: expected a class named 'Model' (or Triton's 'TritonPythonModel'), found none",
            str(model_file),
        )
    infer = getattr(cls, "infer", None)
    if not callable(infer):
        raise ModelLoadError(
            model_name, f"{model_file}: class Model has no method 'infer'", str(model_file)
        )
    return ModelClass(
        cls=cls,
        module=module,
        path=model_file,
        infer_is_async=inspect.iscoroutinefunction(infer) or inspect.isasyncgenfunction(infer),
        infer_is_generator=inspect.isgeneratorfunction(infer) or inspect.isasyncgenfunction(infer),
        infer_takes_parameters=_takes_second_argument(infer),
        has_batch_size=callable(getattr(cls, "batch_size", None)),
        has_close=callable(getattr(cls, "close", None)),
        init_takes_context=_takes_context(cls),
    )


def unload_model_module(model_class: ModelClass) -> None:
    """Forget the modules imported for one model version, so a reload imports afresh."""
    package = model_class.module.__name__.rpartition(".")[0]
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        sys.modules.pop(name, None)


def _takes_context(cls: type) -> bool:
    """Whether ``Model(context)`` is the way to build it (else ``Model()``)."""
    init = next(vars(base)["__init__"] for base in cls.__mro__ if "__init__" in vars(base))  # object has one
    return init is not object.__init__ and _takes_argument(init, 1)


def _takes_second_argument(infer: object) -> bool:
    """Whether ``Model.infer`` accepts a parameter after ``self`` and ``inputs``."""
    return _takes_argument(infer, 2)


def _takes_argument(method: object, index: int) -> bool:
    """Whether an unbound ``method`` accepts a positional argument at ``index`` (0 is
    ``self``). True when its signature cannot be read (call it the documented way)."""
    try:
        parameters = list(inspect.signature(method).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return index < 2
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) > index or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _ensure_package(name: str, folder: Path | None) -> None:
    if name in sys.modules:
        return
    package = types.ModuleType(name)
    package.__path__ = [str(folder)] if folder is not None else []
    package.__package__ = name
    sys.modules[name] = package


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
