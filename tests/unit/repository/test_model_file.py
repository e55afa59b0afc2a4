"""Importing model.py by path: unique modules, sibling helpers, clear failure reasons."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from nereid.errors import ModelLoadError
from nereid.repository.model_file import load_model_class, unload_model_module


def model_dir(tmp_path: Path, name: str, model: str, files: dict[str, str] | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(model))
    for rel, text in (files or {}).items():
        (folder / rel).write_text(textwrap.dedent(text))
    return folder / "model.py"


def test_two_models_may_each_import_a_helper_module_of_the_same_name(tmp_path: Path) -> None:
    model = """
    import helper
    from . import helper as relative_helper
    class Model:
        def infer(self, inputs):
            return helper.VALUE, relative_helper.VALUE
    """
    path_sys = list(sys.path)
    a = load_model_class(model_dir(tmp_path, "a", model, {"helper.py": "VALUE = 'a'"}), "a")
    b = load_model_class(model_dir(tmp_path, "b", model, {"helper.py": "VALUE = 'b'"}), "b")
    assert a.cls().infer({}) == ("a", "a")
    assert b.cls().infer({}) == ("b", "b")
    assert "helper" not in sys.modules
    assert sys.path == path_sys


def test_async_and_optional_methods_are_detected(tmp_path: Path) -> None:
    loaded = load_model_class(model_dir(tmp_path, "m", """
    class Model:
        async def infer(self, inputs):
            return {}
        def batch_size(self, inputs):
            return 1
        def close(self):
            pass
    """), "m")
    assert loaded.infer_is_async and loaded.has_batch_size and loaded.has_close
    assert not loaded.infer_is_generator


def test_reload_imports_the_file_afresh(tmp_path: Path) -> None:
    path = model_dir(tmp_path, "m", "class Model:\n    V = 1\n    def infer(self, inputs):\n        return {}\n")
    first = load_model_class(path, "m")
    unload_model_module(first)
    path.write_text("class Model:\n    V = 2\n    def infer(self, inputs):\n        return {}\n")
    assert load_model_class(path, "m").cls.V == 2


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        pytest.param("import no_such_module_xyz\n", "import failed: ModuleNotFoundError: No module named 'no_such_module_xyz'", id="import-error"),
        pytest.param("raise RuntimeError('boom')\n", "import failed: RuntimeError: boom", id="raises-at-import"),
        pytest.param("def (:\n", "import failed: SyntaxError", id="syntax-error"),
        pytest.param("class Other:\n    pass\n", "expected a class named 'Model' (or Triton's 'TritonPythonModel'), found none", id="no-model-class"),
        pytest.param("class Model:\n    pass\n", "class Model has no method 'infer'", id="no-infer"),
    ],
)
def test_broken_model_file_gives_a_reason_naming_the_file(tmp_path: Path, source: str, reason: str) -> None:
    path = model_dir(tmp_path, "m", source)
    with pytest.raises(ModelLoadError) as info:
        load_model_class(path, "m")
    assert info.value.reason.startswith(f"{path}: ")
    assert reason in info.value.reason


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="model file not found"):
        load_model_class(tmp_path / "nope" / "model.py", "nope")


@pytest.mark.parametrize(
    ("signature", "takes"),
    [
        pytest.param("def infer(self, inputs):", False, id="inputs-only"),
        pytest.param("def infer(self, inputs, parameters):", True, id="with-parameters"),
        pytest.param("async def infer(self, inputs, parameters):", True, id="async-with-parameters"),
        pytest.param("def infer(self, inputs, *rest):", True, id="var-positional"),
        pytest.param("def infer(self, inputs, *, flag=False):", False, id="keyword-only"),
    ],
)
def test_a_second_infer_argument_asks_for_request_parameters(tmp_path: Path, signature: str, takes: bool) -> None:
    path = model_dir(tmp_path, "m", f"class Model:\n    {signature}\n        return {{}}\n")
    assert load_model_class(path, "m").infer_takes_parameters is takes


@pytest.mark.parametrize(
    ("init", "takes_context"),
    [
        pytest.param("", False, id="no __init__"),
        pytest.param("    def __init__(self):\n        pass\n", False, id="self only"),
        pytest.param("    def __init__(self, context):\n        pass\n", True, id="context"),
        pytest.param("    def __init__(self, *args):\n        pass\n", True, id="varargs"),
    ],
)
def test_a_model_without_a_context_parameter_is_built_with_no_arguments(
    tmp_path: Path, init: str, takes_context: bool
) -> None:
    model = "class Model:\n" + init + "    def infer(self, inputs):\n        return inputs\n"
    loaded = load_model_class(model_dir(tmp_path, "m", model), "m")
    assert loaded.init_takes_context is takes_context
