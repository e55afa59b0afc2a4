"""Tensors on a model's device: the GPU data path (``input_tensors = "torch"``).

Owns moving a batch's numpy inputs onto the instance's device as torch tensors (through a
pinned host buffer per input, reused batch after batch, copied to the GPU without
blocking) and bringing a batch's CUDA tensor outputs back in one device-to-host copy
(``outputs_to_host``, which waits; ``DeviceOutputs``, which queues the copy and waits
later, so the next batch can queue its kernels meanwhile); and the turns a model version's instances on one CUDA device take to queue their work
(``DispatchTurns``). torch is imported lazily: only by models that ask for tensors or return
CUDA tensors. Knows nothing of requests, batches or HTTP.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ContextManager

import numpy as np

__all__ = ["DeviceInputs", "DeviceOutputs", "DispatchTurns", "INPUT_TENSOR_FORMATS", "OutputsInFlight",
           "outputs_to_host"]

#: ``input_tensors`` values: numpy arrays (the default) or torch tensors on the device.
INPUT_TENSOR_FORMATS = ("numpy", "torch")


class DeviceInputs:
    """Turns a batch's inputs into torch tensors on ``device`` (``"cpu"`` or ``"cuda:N"``).

    On a GPU each input is copied into a pinned host buffer (one per input name and per
    thread that runs batches, grown when a batch needs more, reused otherwise) and from
    there to the device with ``non_blocking=True``, on the current stream, so the model's
    kernels queue behind the copy and the thread goes on at once; the next batch on that
    thread waits for the copy (a CUDA event) before it reuses the buffer. On the CPU the
    arrays become tensors without a copy. STRING inputs, and dtypes torch has no tensor
    for, stay numpy arrays."""

    def __init__(self, device: str) -> None:
        import torch  # lazily: only models that ask for tensors load it

        self._torch = torch
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._local = threading.local()
        self._dtypes: dict[np.dtype[Any], Any] = {}

    @property
    def pinned_bytes(self) -> int:
        """The pinned host memory held by the calling thread's buffers."""
        buffers: dict[str, Any] = getattr(self._local, "buffers", {})
        return sum(int(buffer.numel()) for buffer in buffers.values())

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        if not self._cuda:
            return {name: self._on_cpu(array) for name, array in inputs.items()}
        torch = self._torch
        local = self._local
        copied = getattr(local, "copied", None)
        if copied is not None:
            copied.synchronize()  # the last batch's copies have left the buffers
        buffers: dict[str, Any] = local.__dict__.setdefault("buffers", {})
        moved: dict[str, Any] = {}
        for name, array in inputs.items():
            if not _tensor_dtype(array):
                moved[name] = array
                continue
            size = array.nbytes
            buffer = buffers.get(name)
            if buffer is None or buffer.numel() < size:
                buffer = buffers[name] = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=True)
            staged = buffer[:size].view(self._dtype(array.dtype)).reshape(array.shape)
            np.copyto(staged.numpy(), array)  # the gather's one copy, into pinned memory
            moved[name] = staged.to(self.device, non_blocking=True)
        # on the stream the copies (and the model's kernels) run on, whichever device this
        # thread has current
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        local.copied = event
        return moved

    def _dtype(self, dtype: np.dtype[Any]) -> Any:
        """torch's dtype for a numpy dtype (one that ``_tensor_dtype`` accepts)."""
        found = self._dtypes.get(dtype)
        if found is None:
            found = self._dtypes[dtype] = self._torch.from_numpy(np.empty(0, dtype)).dtype
        return found

    def _on_cpu(self, array: np.ndarray) -> Any:
        if not _tensor_dtype(array):
            return array
        if not array.flags.writeable:  # torch warns on read-only memory (a request's bytes)
            array = array.copy()
        return self._torch.from_numpy(array)


class DeviceOutputs:
    """Brings a batch's CUDA tensor outputs to the host without waiting for them there
    and then: ``start`` queues one device-to-host copy of all of them (laid end to end as
    bytes) into a pinned buffer of the calling thread's (grown when a batch needs more,
    reused otherwise) on the current stream, behind the model's kernels, and records an
    event; ``OutputsInFlight.wait`` waits for that event and reads the outputs back as
    numpy arrays of their own dtypes and shapes, views on the buffer, good until the
    thread's next ``start``. Between the two, the instance's next batch queues its own
    kernels, so the device goes from one batch to the next without waiting for the host
    (the copy sits on the stream before them)."""

    def __init__(self, device: str) -> None:
        import torch  # lazily: only models on a CUDA device get here

        self._torch = torch
        self.device = torch.device(device)
        self._local = threading.local()

    @property
    def pinned_bytes(self) -> int:
        """The pinned host memory held by the calling thread's buffer."""
        buffer = getattr(self._local, "buffer", None)
        return 0 if buffer is None else int(buffer.numel())

    def start(self, raw: Any) -> OutputsInFlight | None:
        """The copy of ``raw``'s CUDA tensors queued; None where there is nothing to queue
        (not a dict of outputs, no CUDA tensor, or one on another device than this
        instance's): the caller then waits for the stream and converts as before."""
        if not isinstance(raw, dict):
            return None
        names = _cuda_tensors(raw)
        if not names or any(raw[name].device != self.device for name in names):
            return None
        torch = self._torch
        tensors, flat = _laid_end_to_end(torch, raw, names)
        size = int(flat.numel())
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.numel() < size:
            buffer = self._local.buffer = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=True)
        host = buffer[:size]
        host.copy_(flat, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        return OutputsInFlight(raw, names, tensors, host, copied)


class OutputsInFlight:
    """A batch's outputs on their way to the host (``DeviceOutputs.start``)."""

    def __init__(self, raw: dict[str, Any], names: list[str], tensors: list[Any], host: Any, copied: Any) -> None:
        self._raw = raw
        self._names = names
        self._tensors = tensors  # held until the copy has read them
        self._host = host
        self._copied = copied

    def wait(self) -> dict[str, Any]:
        """The outputs, each CUDA tensor now a numpy array (anything else as the model
        returned it), once the batch's kernels and the copy have run. Raises what the
        device reports (an illegal access, say) as the batch's failure."""
        self._copied.synchronize()
        outputs = _read_back(self._raw, self._names, self._tensors, self._host)
        self._tensors = []
        return outputs


class DispatchTurns:
    """The turns a model version's instances in one process take on each CUDA device
    while their ``infer`` runs: one lock per device, held around the call, released
    before the outputs are brought back (their kernels still run on the instance's stream
    while the next instance queues its own).

    A torch model on a GPU spends its ``infer`` queueing kernels from Python, and torch
    lets go of the GIL at every operation: two instances queueing at once in one process
    hand the GIL back and forth hundreds of times a batch and each runs at half speed or
    worse (two threads of a small BERT on the CPU: 0.47x one thread together, 0.9x taking
    turns; two GPU instances in one process served 0.48x one instance on an H100). Taking
    turns, one instance queues while the other's kernels run. Off CUDA there are no turns:
    CPU instances overlap wherever their code lets go of the GIL."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}

    def turn(self, device: str) -> ContextManager[Any]:
        """The context an instance on ``device`` runs its ``infer`` in."""
        if not device.startswith("cuda"):
            return contextlib.nullcontext()
        return self._locks.setdefault(device, threading.Lock())


def _tensor_dtype(array: np.ndarray) -> bool:
    """Whether torch has a tensor for ``array``'s dtype (not objects, bytes or ml_dtypes')."""
    return array.dtype.kind in "biuf" and array.dtype.isbuiltin == 1


def outputs_to_host(raw: Any) -> Any:
    """A model's return value with its CUDA tensors brought to the host in one copy: the
    tensors are laid end to end on the device (as bytes) and copied once, then read back
    as numpy arrays of their own dtypes and shapes. Anything else is left as is (split()
    converts and checks it)."""
    if not isinstance(raw, dict) or all(type(value) is np.ndarray for value in raw.values()):
        return raw
    on_gpu = _cuda_tensors(raw)
    if len(on_gpu) < 2:
        return raw  # one tensor is one copy anyway (split's tensor_to_numpy)
    import torch  # loaded already: the model returned its tensors

    tensors, flat = _laid_end_to_end(torch, raw, on_gpu)
    return _read_back(raw, on_gpu, tensors, flat.cpu())


def _cuda_tensors(raw: dict[str, Any]) -> list[str]:
    """The names of ``raw``'s CUDA tensors, widest elements first: laid end to end, each
    then starts at a multiple of its element size (a byte view is read back as its dtype
    only from such an offset)."""
    names = [
        name for name, value in raw.items()
        if type(value).__module__.startswith("torch") and getattr(value, "is_cuda", False)
    ]
    names.sort(key=lambda name: -raw[name].element_size())
    return names


def _laid_end_to_end(torch: Any, raw: dict[str, Any], names: list[str]) -> tuple[list[Any], Any]:
    """The tensors ``names`` of ``raw`` (contiguous) and their bytes end to end, on their
    device (queued on the current stream)."""
    tensors = [raw[name].detach().contiguous() for name in names]
    pieces = [tensor.reshape(-1).view(torch.uint8) for tensor in tensors]
    return tensors, pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _read_back(raw: dict[str, Any], names: list[str], tensors: list[Any], host: Any) -> dict[str, Any]:
    """``raw`` with each tensor of ``names`` read back from ``host`` (their bytes end to end,
    on the host) as a numpy array of its own dtype and shape; anything else as it is."""
    from nereid.tensors.assembly import tensor_to_numpy

    converted = dict(raw)
    offset = 0
    for name, tensor in zip(names, tensors):
        size = tensor.numel() * tensor.element_size()
        converted[name] = tensor_to_numpy(host[offset:offset + size].view(tensor.dtype).reshape(tensor.shape))
        offset += size
    return converted
