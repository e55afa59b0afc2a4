"""What a process instance's replies carry, read on the server's side: outputs in the
slot's shared-memory arena (``reply_outputs``; a new arena adopted when the process
replaced it: ``adopt_arena``), or what ``infer`` returned, pickled, with stand-ins for
the values the process could not pickle (``restore_unsendable``), so that ``split``
checks and words them as for a thread instance.
"""

from __future__ import annotations

import functools
from typing import Any

from nereid.instances.channel import Arena, Unsendable, read_arrays
from nereid.instances.link import Slot

__all__ = ["adopt_arena", "reply_outputs", "restore_unsendable"]


def adopt_arena(slot: Slot, fds: list[int]) -> None:
    """The process replaced its outputs arena (the descriptor came with a reply)."""
    if fds:
        if slot.outputs is None:
            slot.outputs = Arena(fd=fds[0])
        else:
            slot.outputs.adopt(fds)


def reply_outputs(slot: Slot, message: Any) -> Any:
    """The raw outputs an ``infer`` / ``stream`` reply carries (arrays copied out of the arena)."""
    if message[0].endswith("-raw"):  # what infer returned, pickled: split checks it
        return restore_unsendable(message[1])
    assert slot.outputs is not None
    return read_arrays(slot.outputs, message[1], copy=True)


def restore_unsendable(outputs: Any) -> Any:
    """Raw outputs with each Unsendable (a value the process could not pickle) replaced
    by an object of a class named like the value's type: split's errors then name it as
    for a thread instance."""
    if isinstance(outputs, Unsendable):
        return _stand_in(outputs.type_name)
    if isinstance(outputs, dict) and any(isinstance(value, Unsendable) for value in outputs.values()):
        return {k: _stand_in(v.type_name) if isinstance(v, Unsendable) else v for k, v in outputs.items()}
    return outputs


def _stand_in(type_name: str) -> object:
    return _stand_in_class(type_name)()


@functools.cache  # one class per type name met (a few at most)
def _stand_in_class(type_name: str) -> type:
    return type(type_name, (), {"__module__": "nereid.instances.worker", "__slots__": ()})
