"""The tensors the sequence batcher adds to a step and keeps from it: control inputs
(START, END, READY, CORRID) filled as Triton fills them, implicit state, and the null
request that fills an empty slot of a direct batch.

Owns their values, dtypes and shapes, and the config the instances run with (the model's
inputs and outputs plus these). Knows nothing about slots or batches (sequences.py) nor
about HTTP.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from nereid.config.schema import ModelConfig, ModelInput, ModelOutput, SequenceControl, SequenceState
from nereid.config.sequence_batching import CORRID, END, READY, START
from nereid.datatypes import DataType, by_config_name
from nereid.errors import InvalidInputError, ModelLoadError
from nereid.inference import InferRequest, SequenceFlags
from nereid.tensors.assembly import signature_function

__all__ = ["SequenceTensors", "execution_config"]


def _control_type(control: SequenceControl) -> DataType:
    if control.kind == CORRID:
        assert control.data_type is not None  # the config's rules
        return control.data_type
    name = "TYPE_INT32" if control.int32_false_true else "TYPE_FP32" if control.fp32_false_true else "TYPE_BOOL"
    data_type = by_config_name(name)
    assert data_type is not None
    return data_type


def _blank(array: np.ndarray) -> np.ndarray:
    """Zeros (BYTES: empty) of ``array``'s shape and dtype."""
    if array.dtype == object:
        return np.full(array.shape, b"", dtype=object)
    return np.zeros_like(array)


def execution_config(config: ModelConfig) -> ModelConfig:
    """The config an instance of a sequence model runs with: its inputs plus the control
    and state inputs, its outputs plus the state outputs (so batches assemble and split
    them like any tensor). Clients and /config see ``config`` itself."""
    batching = config.sequence_batching
    if batching is None:
        return config
    inputs = [ModelInput(item.name, _control_type(item.control[0]), (1,)) for item in batching.control_input]
    inputs += [ModelInput(state.input_name, state.data_type, state.dims) for state in batching.state]
    outputs = [ModelOutput(state.output_name, state.data_type, state.dims) for state in batching.state]
    return dataclasses.replace(config, input=config.input + tuple(inputs), output=config.output + tuple(outputs))


class SequenceTensors:
    """One sequence model's controls and states: ``check`` a request's correlation id,
    ``step`` adds a request's control and state inputs, ``keep`` takes the state outputs
    out of its answer."""

    def __init__(self, config: ModelConfig, model_dir: Path) -> None:
        batching = config.sequence_batching
        assert batching is not None
        self.model_name = config.name
        self._batched = config.max_batch_size > 0
        self._controls = [(item.name, item.control[0], _control_type(item.control[0]))
                          for item in batching.control_input]
        self._corrid = next(((name, dt) for name, control, dt in self._controls if control.kind == CORRID), None)
        self._states = batching.state
        self._initial = {state.input_name: self._initial_value(state, model_dir) for state in batching.state}
        self.state_outputs = {state.output_name: state.input_name for state in batching.state}
        #: the key under which two requests' inputs may share a batch (equal shapes, the
        #: same optional inputs): Triton's enforce_equal_shape_tensors for a sequence batch.
        self.signature = signature_function(config)

    def _shaped(self, array: np.ndarray) -> np.ndarray:
        return array.reshape((1, *array.shape)) if self._batched else array

    def _initial_value(self, state: SequenceState, model_dir: Path) -> np.ndarray:
        """A state's value on START: its initial_state (zeros, or a data file in the model
        folder's ``initial_state/``), else zeros."""
        dtype = state.data_type.numpy
        initial = state.initial_state[0] if state.initial_state else None
        dims = initial.dims if initial is not None else tuple(max(d, 1) for d in state.dims)
        if initial is None or initial.zero_data:
            if state.data_type.is_bytes:
                return np.full(dims, b"", dtype=object)
            return np.zeros(dims, dtype=dtype)
        path = model_dir / "initial_state" / initial.data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(self.model_name, f"{path}: initial_state data_file of state "
                                 f"'{state.input_name}' cannot be read ({exc.strerror})") from exc
        count = int(np.prod(dims))
        if state.data_type.is_bytes or len(raw) != count * dtype.itemsize:
            raise ModelLoadError(self.model_name, f"{path}: initial_state of state '{state.input_name}' expected "
                                 f"{count * dtype.itemsize} bytes ({count} {state.data_type.wire_name} values), "
                                 f"got {len(raw)}")
        return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()

    def check(self, request: InferRequest) -> None:
        """Triton's ValidateCorrelationId: a string id needs a TYPE_STRING CORRID, an
        integer id an integer one."""
        flags = request.sequence
        if self._corrid is None or flags is None:
            return
        name, dt = self._corrid
        is_string = isinstance(flags.id, str)
        if is_string != dt.is_bytes:
            got = "BYTES" if is_string else "UINT64"
            raise InvalidInputError(
                f"[request id: {request.id or '<id_unknown>'}] sequence batching control '{name}' data-type is "
                f"'{got}', but model '{self.model_name}' expects '{dt.wire_name}'", model=self.model_name)

    def step(self, request: InferRequest, state: Mapping[str, np.ndarray] | None) -> InferRequest:
        """``request`` with its control inputs and state inputs added (``state``: the
        sequence's kept state; None or a START: the initial state)."""
        flags = request.sequence
        assert flags is not None  # admitted
        inputs = dict(request.inputs)
        for name, control, dt in self._controls:
            inputs[name] = self._control_value(control, dt, flags)
        fresh = state is None or flags.start
        for input_name, initial in self._initial.items():
            value = initial if fresh or state is None or input_name not in state else state[input_name]
            inputs[input_name] = self._shaped(value)
        return dataclasses.replace(request, inputs=inputs)

    def null(self, stepped: InferRequest) -> InferRequest:
        """The request for an empty slot of a direct batch, made from a stepped request of
        the same batch (Triton's InferenceRequest::CopyAsNull and the not-ready controls):
        the same inputs and state inputs with the same shapes, holding zeros (Triton leaves
        them uninitialised; BYTES empty); START, END and READY false; CORRID 0 (a string
        CORRID: empty); no correlation id, flags or parameters of its own. Its outputs are
        dropped and no sequence's state changes."""
        inputs = {name: _blank(array) for name, array in stepped.inputs.items()}
        for name, control, dt in self._controls:
            if control.kind == CORRID:
                value: Any = b"" if dt.is_bytes else 0
                inputs[name] = self._shaped(np.array([value], dtype=object if dt.is_bytes else dt.numpy))
            else:
                pair: tuple[Any, ...] = control.int32_false_true or control.fp32_false_true or control.bool_false_true
                inputs[name] = self._shaped(np.array([pair[0]], dtype=dt.numpy))
        return InferRequest(stepped.model_name, inputs, model_version=stepped.model_version)

    def warmup(self, request: InferRequest) -> InferRequest:
        """A ``[[model_warmup]]`` sample as a whole sequence of one step (START and END,
        correlation id 1), each control and state repeated for the sample's rows (Triton
        warms a sequence model up through its backend, with no scheduler to fill them)."""
        corrid = "1" if self._corrid is not None and self._corrid[1].is_bytes else 1
        stepped = self.step(dataclasses.replace(request, sequence=SequenceFlags(corrid, True, True)), None)
        if not self._batched or request.rows == 1:
            return stepped
        inputs = {name: array if name in request.inputs else np.repeat(array, request.rows, axis=0)
                  for name, array in stepped.inputs.items()}
        return dataclasses.replace(stepped, inputs=inputs)

    def _control_value(self, control: SequenceControl, dt: DataType, flags: SequenceFlags) -> np.ndarray:
        if control.kind == CORRID:
            if isinstance(flags.id, str):
                array = np.array([flags.id.encode()], dtype=object)
            else:  # Triton copies the id's low bytes: a narrower CORRID type wraps, never fails
                array = np.array([flags.id], dtype=np.uint64).astype(dt.numpy)
        else:
            on = {START: flags.start, END: flags.end, READY: True}[control.kind]
            pair: tuple[Any, ...] = control.int32_false_true or control.fp32_false_true or control.bool_false_true
            array = np.array([pair[1] if on else pair[0]], dtype=dt.numpy)
        return self._shaped(array)

    def keep(self, outputs: Mapping[str, np.ndarray], state: dict[str, np.ndarray] | None) -> tuple[
            dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """The answer without the state outputs, and the sequence's state after this step
        (a state the model did not return keeps its value)."""
        if not self.state_outputs:
            return dict(outputs), state
        answer: dict[str, np.ndarray] = {}
        kept = dict(state) if state is not None else {}
        for name, array in outputs.items():
            input_name = self.state_outputs.get(name)
            if input_name is None:
                answer[name] = array
            else:  # one row of a batch: the state itself, without the batch dim
                kept[input_name] = np.array(array[0] if self._batched else array)
        return answer, kept
